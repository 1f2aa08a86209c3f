"""What each heartbeat key carries: one model for its `desired` value and one for its `actual` value
(the keys are contracts/heartbeat_keys.py). Both ends read and write these, so a key's shape has one
definition; `parse_desired` and `parse_actual` read a whole heartbeat's values and refuse a key the
contract does not define (tests/contracts/test_heartbeat_keys.py holds the code to them)."""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any, Final, Literal

from pydantic import TypeAdapter

from contracts.device import DeviceActual, DeviceDesired
from contracts.finalize import FinalizeStatus, FinalizeWork
from contracts.gpu_health import GpuHealthReport
from contracts.heartbeat_keys import HeartbeatKey
from contracts.jobs import JobsActual, JobsDesired
from contracts.object_cache import ObjectsActual, ObjectsDesired
from contracts.reservations import ReservationRefusal, ReservationSpec, ReservationStatus

Side = Literal["desired", "actual"]  # HeartbeatResponse.desired or HeartbeatRequest.actual

__all__ = ["ACTUAL", "DESIRED", "HeartbeatKey", "UnknownKey", "parse_actual", "parse_desired"]

# the type of each key's value in HeartbeatResponse.desired
DESIRED: Final[Mapping[HeartbeatKey, Any]] = {
    HeartbeatKey.MAINTENANCE: bool,
    HeartbeatKey.UPNP: bool,
    HeartbeatKey.RESERVATIONS: list[ReservationSpec],
    HeartbeatKey.FINALIZE: FinalizeWork | None,
    HeartbeatKey.JOBS: JobsDesired,
    HeartbeatKey.DEVICE_CONFIG: DeviceDesired | None,
    HeartbeatKey.OBJECTS: ObjectsDesired | None,
    HeartbeatKey.GPU_HEALTH: bool,
}
# the type of each key's value in HeartbeatRequest.actual (a key is reported once its handler ran)
ACTUAL: Final[Mapping[HeartbeatKey, Any]] = {
    HeartbeatKey.MAINTENANCE: bool,
    HeartbeatKey.UPNP: None,
    HeartbeatKey.RESERVATIONS: list[ReservationStatus | ReservationRefusal],
    HeartbeatKey.FINALIZE: FinalizeStatus,
    HeartbeatKey.JOBS: JobsActual,
    HeartbeatKey.DEVICE_CONFIG: DeviceActual,
    HeartbeatKey.OBJECTS: ObjectsActual,
    HeartbeatKey.GPU_HEALTH: GpuHealthReport,
}


class UnknownKey(ValueError):
    """A heartbeat value under a key contracts/heartbeat_keys.py does not define."""


@cache
def _adapter(side: Side, key: HeartbeatKey) -> TypeAdapter[Any]:
    return TypeAdapter((DESIRED if side == "desired" else ACTUAL)[key])


def _parse(side: Side, values: Mapping[str, Any]) -> dict[HeartbeatKey, Any]:
    parsed: dict[HeartbeatKey, Any] = {}
    for name, value in values.items():
        try:
            key = HeartbeatKey(name)
        except ValueError:
            raise UnknownKey(f"{side} key {name!r} is not defined in contracts/heartbeat_keys.py") from None
        parsed[key] = _adapter(side, key).validate_python(value)
    return parsed


def parse_desired(desired: Mapping[str, Any]) -> dict[HeartbeatKey, Any]:
    """Every value of a HeartbeatResponse.desired as its key's model (ValidationError, UnknownKey)."""
    return _parse("desired", desired)


def parse_actual(actual: Mapping[str, Any]) -> dict[HeartbeatKey, Any]:
    """Every value of a HeartbeatRequest.actual as its key's model (ValidationError, UnknownKey)."""
    return _parse("actual", actual)


def dump(side: Side, key: HeartbeatKey, value: Any) -> Any:
    """A parsed value back to its JSON form, as it travels."""
    return _adapter(side, key).dump_python(value, mode="json")
