"""A device's inference states, apart from the device's models: the control plane's state tables read them
in every `provision` command, which must not pay for building the pydantic models."""

from __future__ import annotations

from enum import StrEnum


class InferenceState(StrEnum):
    """What the device's inference container does (observed by the minion, shown by `device show`)."""

    DEPLOYING = "deploying"  # being prepared or created, not yet running
    RUNNING = "running"
    EXITED = "exited"  # the command ended by itself: not restarted until the next deploy or reboot
    FAILED = "failed"  # never ran (bad image, mount refused): `message` says why
