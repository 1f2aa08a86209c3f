"""What a heartbeat answers and records, key by key (contracts/heartbeat_keys.py): each key's contributor
(its `desired` value for the beating node) and reporter (what to do with the node's `actual` value), listed
here once for every domain. A new key is a line in the contract and a line in each table below.

The answer's keys come in CONTRIBUTORS' order: `upnp` before `reservations`, so the minion builds its
reservations agent with the node's UPnP setting already applied."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Final

from sqlalchemy.orm import Session

from contracts.heartbeat_keys import HeartbeatKey
from provisioner.services.common.desired_state import Contributor, CouldFind, HeartbeatKeys, Reporter
from provisioner.services.devices import device_deployments
from provisioner.services.fleet import finalize, gpu_health, heartbeat
from provisioner.services.jobs import job_assignments
from provisioner.services.objects import node_caches
from provisioner.services.regions import reservations

CONTRIBUTORS: Final[Mapping[HeartbeatKey, Contributor]] = {
    HeartbeatKey.UPNP: reservations.upnp_for_node,
    HeartbeatKey.RESERVATIONS: reservations.desired_for_node,
    HeartbeatKey.JOBS: job_assignments.desired_for_node,
    HeartbeatKey.DEVICE_CONFIG: device_deployments.desired_for_node,
    HeartbeatKey.OBJECTS: functools.partial(
        node_caches.desired_for_node, also=device_deployments.objects_in_region
    ),
    HeartbeatKey.FINALIZE: finalize.desired_for_node,
    HeartbeatKey.MAINTENANCE: heartbeat.maintenance_for_node,
    HeartbeatKey.GPU_HEALTH: gpu_health.desired_for_node,
}
REPORTERS: Final[Mapping[HeartbeatKey, Reporter]] = {
    HeartbeatKey.RESERVATIONS: reservations.record_actual,
    HeartbeatKey.JOBS: job_assignments.record_actual,
    HeartbeatKey.DEVICE_CONFIG: device_deployments.record_actual,
    HeartbeatKey.OBJECTS: node_caches.record_actual,
    HeartbeatKey.FINALIZE: finalize.record_actual,
    HeartbeatKey.GPU_HEALTH: gpu_health.record_actual,
}
# The store reads a beat makes for its contributors and reporters, each with the question that tells
# whether it could find anything: the heartbeat asks them all in its first query and skips the reads
# answered "nothing" (most nodes serve no reservation and run no job).
SKIPPABLE_READS: Final[Mapping[str, CouldFind]] = {
    reservations.SERVED_READ: reservations.could_serve,
    job_assignments.WORKERS_READ: job_assignments.could_know_workers,
    node_caches.MOUNTED_READ: node_caches.could_mount,
}
KEYS: Final = HeartbeatKeys(CONTRIBUTORS, REPORTERS, SKIPPABLE_READS)


# One heartbeat (services/fleet/heartbeat.py) with every domain's keys.
beat: Final = functools.partial(heartbeat.beat, keys=KEYS)


def desired_for(session: Session, node: Any) -> dict[str, Any]:
    """The node's whole desired state, as its next heartbeat answer carries it."""
    return KEYS.desired_for(session, node)


def record_actual(session: Session, node: Any, actual: dict[str, Any]) -> None:
    """Hand each reported key to its reporter; unknown keys (a newer minion) are ignored."""
    KEYS.record_actual(session, node, actual)
