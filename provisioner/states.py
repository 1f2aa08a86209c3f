"""Lifecycles as data: one enum per resource, one comment per state, one transition table each.

The service layer is the only place that changes a state, and it always asks `check()` first, so an
illegal move is refused the same way whether it comes from an operator, the join protocol or a
reconciler. `online` is deliberately NOT a state: it is derived from the age of the last heartbeat
(see `is_online`), so a node never has two statuses that can disagree."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from enum import StrEnum
from typing import Mapping, TypeVar

from provisioner.errors import RuleViolation

# A node whose last heartbeat is older than this is shown offline. The minion heartbeats every
# 30 s; three missed beats is the usual threshold before paging anyone.
ONLINE_WINDOW = timedelta(seconds=90)


class ProviderState(StrEnum):
    NEW = "new"  # recorded, provider-side setup not finished yet (GCP: topics, sinks)
    ENABLED = "enabled"  # regions may be created
    ERRORED = "errored"  # setup failed; `reason` says why
    REMOVING = "removing"  # teardown in progress
    REMOVED = "removed"  # kept for the audit trail; the kind may be enabled again


class RegionState(StrEnum):
    NEW = "new"  # created, no node has reported yet
    HEALTHY = "healthy"  # its storage node (if any) and nodes report
    OFFLINE = "offline"  # nothing in it has reported within the online window
    REMOVING = "removing"  # teardown in progress (GCP: storage node deletion)
    REMOVED = "removed"  # kept for the audit trail; the name may be reused
    ERRORED = "errored"  # provider-side failure; `reason` says why


class NodeState(StrEnum):
    NEW = "new"  # added by an operator with its minion_id, waiting for that minion to join
    ENROLLING = "enrolling"  # the minion is joining: EK/AK checks, challenge, quote
    PROVISIONING = "provisioning"  # attested; playbooks finalize the OS
    MAINTENANCE = "maintenance"  # ready but not taking jobs (compute nodes wait here until activated)
    ACTIVE = "active"  # taking jobs
    ERRORED = "errored"  # join or provisioning failed; `reason` says why; retry goes back to new
    REMOVED = "removed"  # kept for history; name and minion_id may be reused


class Service(StrEnum):
    COMPUTE = "compute"
    STORAGE = "storage"


class Maintenance(StrEnum):
    """What `node maintenance` asks for; one enum for the CLI's choices and the service's rule."""
    ON = "on"  # active → maintenance
    OFF = "off"  # maintenance → active
    TOGGLE = "toggle"  # whichever of the two the node's current state allows


class StorageMode(StrEnum):
    LOCAL = "local"  # each compute node keeps job data on its own SATA drives
    CENTRAL = "central"  # one storage node serves the region over >= 10 GbE


PROVIDER_TRANSITIONS: dict[ProviderState, frozenset[ProviderState]] = {
    # NEW → REMOVING: removed while its bootstrap runs; the teardown deletes whatever was made already
    ProviderState.NEW: frozenset({ProviderState.ENABLED, ProviderState.ERRORED, ProviderState.REMOVING, ProviderState.REMOVED}),
    ProviderState.ENABLED: frozenset({ProviderState.REMOVING, ProviderState.REMOVED, ProviderState.ERRORED}),
    ProviderState.ERRORED: frozenset({ProviderState.NEW, ProviderState.REMOVING, ProviderState.REMOVED}),
    ProviderState.REMOVING: frozenset({ProviderState.REMOVED, ProviderState.ERRORED}),
    ProviderState.REMOVED: frozenset(),
}

REGION_TRANSITIONS: dict[RegionState, frozenset[RegionState]] = {
    RegionState.NEW: frozenset({RegionState.HEALTHY, RegionState.OFFLINE, RegionState.ERRORED, RegionState.REMOVING}),
    RegionState.HEALTHY: frozenset({RegionState.OFFLINE, RegionState.ERRORED, RegionState.REMOVING}),
    RegionState.OFFLINE: frozenset({RegionState.HEALTHY, RegionState.ERRORED, RegionState.REMOVING}),
    RegionState.ERRORED: frozenset({RegionState.HEALTHY, RegionState.OFFLINE, RegionState.REMOVING}),
    RegionState.REMOVING: frozenset({RegionState.REMOVED, RegionState.ERRORED}),
    RegionState.REMOVED: frozenset(),
}

NODE_TRANSITIONS: dict[NodeState, frozenset[NodeState]] = {
    NodeState.NEW: frozenset({NodeState.ENROLLING, NodeState.ERRORED, NodeState.REMOVED}),
    NodeState.ENROLLING: frozenset({NodeState.PROVISIONING, NodeState.ERRORED, NodeState.REMOVED}),
    NodeState.PROVISIONING: frozenset({NodeState.MAINTENANCE, NodeState.ERRORED, NodeState.REMOVED}),
    NodeState.MAINTENANCE: frozenset({NodeState.ACTIVE, NodeState.ERRORED, NodeState.REMOVED}),
    NodeState.ACTIVE: frozenset({NodeState.MAINTENANCE, NodeState.ERRORED, NodeState.REMOVED}),
    # retry: an errored node starts over from new (waits for its minion to join again)
    NodeState.ERRORED: frozenset({NodeState.NEW, NodeState.REMOVED}),
    NodeState.REMOVED: frozenset(),
}

S = TypeVar("S", ProviderState, RegionState, NodeState)


def check(kind: str, name: str, table: Mapping[S, frozenset[S]], current: S, target: S) -> None:
    """Refuse an illegal transition with a sentence naming the current state and the way out."""
    if target in table[current]:
        return
    allowed = ", ".join(sorted(s.value for s in table[current])) or "nothing (it is final)"
    raise RuleViolation(
        f"{kind} '{name}' is {current.value} and cannot go to {target.value}: from {current.value} it can go to {allowed}",
        code="illegal_transition",
    )


def is_online(last_heartbeat_at: datetime | None, now: datetime | None = None) -> bool:
    """A node is online when it heartbeated within ONLINE_WINDOW; never-seen nodes are offline."""
    if last_heartbeat_at is None:
        return False
    now = now or datetime.now(timezone.utc)
    if last_heartbeat_at.tzinfo is None:
        last_heartbeat_at = last_heartbeat_at.replace(tzinfo=timezone.utc)
    return now - last_heartbeat_at <= ONLINE_WINDOW
