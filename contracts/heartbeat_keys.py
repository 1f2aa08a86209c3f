"""The keys of a heartbeat: `HeartbeatResponse.desired` (control plane → minion) and `HeartbeatRequest.actual`
(minion → control plane) carry one entry per key. Named here once and nowhere else; the model of each
key's value is in contracts/heartbeat.py. This module imports nothing, so any module can name a key."""

from __future__ import annotations

from enum import StrEnum


class HeartbeatKey(StrEnum):
    MAINTENANCE = "maintenance"  # desired: the node should hold no jobs; actual: the node's acknowledgement
    UPNP = "upnp"  # desired: the node's UPnP setting (`provision node add --no-upnp`); actual: null
    RESERVATIONS = "reservations"  # desired: ReservationSpec list; actual: ReservationStatus list
    FINALIZE = "finalize"  # desired: FinalizeWork or null; actual: FinalizeReport
    JOBS = "jobs"  # desired: JobsDesired; actual: JobsActual
    DEVICE_CONFIG = "device_config"  # desired: DeviceDesired (devices) or null; actual: DeviceActual
    OBJECTS = "objects"  # desired: ObjectsDesired or null (devices); actual: ObjectsActual, its cache
    GPU_HEALTH = "gpu_health"  # desired: whether to report it; actual: GpuHealthReport (NVML: facts, health)
