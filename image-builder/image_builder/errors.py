"""The image builder's one error type: a message that says what to do next. It derives from the shared
error base (contracts/errors.py), so a build refusal carries a machine code like every other refusal."""

from __future__ import annotations

from contracts.errors import RigbaseError


class BuildError(RigbaseError):
    """A build step refused or failed; str(error) is one sentence for the operator."""

    default_code = "build_failed"
