"""States of the regional resources as data: reservations (desired and actual kept apart) and datastores.

A reservation has two independent fields. `state` is what the operator wants (unassigned, assigned,
removed) and changes only through the transition table below. `actual_state` is what the assigned
node last reported (published, mapped, conflict, error — minion/reservations/model.py ActualState)
or `pending` until its first report after an assignment. Keeping them apart means a node that is
offline, or a report that arrives after a move, can never undo an operator's decision."""

from __future__ import annotations

from enum import StrEnum

from minion.reservations.model import ActualState as NodeActualState


class ReservationState(StrEnum):
    UNASSIGNED = "unassigned"  # exists, no node serves it (placement will assign automatically later)
    ASSIGNED = "assigned"  # a compute node of its region should publish it (see actual_state)
    REMOVED = "removed"  # kept for the audit trail; name, hostname and port may be reused


class ActualState(StrEnum):
    PENDING = "pending"  # assigned; the node has not reported it yet (offline, or before its next heartbeat)
    PUBLISHED = NodeActualState.PUBLISHED.value  # HOST.local answers with the node's LAN address
    MAPPED = NodeActualState.MAPPED.value  # published, and the router forwards external PORT to it
    CONFLICT = NodeActualState.CONFLICT.value  # another host answers for HOST.local; the node stays silent
    ERROR = NodeActualState.ERROR.value  # see actual_reason (UPnP 718/606, no IGD, bad entry …)


class Protocol(StrEnum):
    TCP = "tcp"
    UDP = "udp"


class DatastoreState(StrEnum):
    ACTIVE = "active"  # usable by jobs of its region
    REMOVED = "removed"  # kept for the audit trail; the name may be reused


class DatastoreType(StrEnum):
    NFS = "nfs"
    SMB = "smb"


RESERVATION_TRANSITIONS: dict[ReservationState, frozenset[ReservationState]] = {
    ReservationState.UNASSIGNED: frozenset({ReservationState.ASSIGNED, ReservationState.REMOVED}),
    # assigned → assigned is a move to another node (one audit line naming both nodes)
    ReservationState.ASSIGNED: frozenset({ReservationState.ASSIGNED, ReservationState.UNASSIGNED,
                                          ReservationState.REMOVED}),
    ReservationState.REMOVED: frozenset(),
}

DATASTORE_TRANSITIONS: dict[DatastoreState, frozenset[DatastoreState]] = {
    DatastoreState.ACTIVE: frozenset({DatastoreState.REMOVED}),
    DatastoreState.REMOVED: frozenset(),
}
