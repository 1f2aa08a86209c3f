"""At join: a node added as a device must report a Jetson, and a node added otherwise must not.

The service is what the operator typed at `add` (docs/devices.md); the minion's inventory says what the
hardware is (its `device` section, contracts/device.py). A proven join whose inventory disagrees sends the
node to errored with the way out, instead of finalizing a Jetson with the compute playbook or waiting for
inference on a machine that has no Jetson."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from contracts.device import DeviceReport
from contracts.errors import plain_validation_message
from provisioner.domain.states import Service
from provisioner.store.models import Node


def service_mismatch(node: Node, inventory: Mapping[str, Any] | None) -> str | None:
    """Why this node's proven inventory does not fit its service, or None."""
    section = inventory.get("device") if isinstance(inventory, Mapping) else None
    service = Service(node.service)
    if service is Service.DEVICE:
        if not isinstance(section, Mapping):
            return (
                f"device '{node.name}' reports no Jetson (no `device` section in its inventory): if it is a "
                f"compute node, remove it and `provision node add {node.name}`"
            )
        try:
            DeviceReport.model_validate(section)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "device"
            said = plain_validation_message(str(first["msg"]))
            return f"device '{node.name}' reports an unreadable `device` section ({where}: {said})"
        return None
    if section is not None:
        return (
            f"{service.value} node '{node.name}' reports a Jetson (a `device` section in its inventory): "
            f"remove it and `provision device add {node.name}`"
        )
    return None
