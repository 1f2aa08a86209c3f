"""Reservations: a host name (published as HOST.local) and a port, unique per region, assigned to a
compute node of that region. The assignment reaches the node as desired state in its heartbeat
response (contributor `reservations`); the node's report comes back in the next heartbeat request
(reporter `reservations`) and is stored apart from the operator's decision (domain.states)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from contracts.errors import Conflict, InvalidInput, NotFound, RuleViolation
from contracts.regional import Protocol
from provisioner.domain.states import (
    RESERVATION_TRANSITIONS,
    ActualState,
    NodeState,
    ReservationState,
    Service,
)
from provisioner.services import audit, desired_state, lifecycle, names, regional_lookup
from provisioner.services import regions as region_service
from provisioner.services.errors import flush
from provisioner.store.models import Node, new_id
from provisioner.store.regional_models import Reservation

KIND = "reservation"
ACTUAL_KIND = "reservation_actual"  # audit lines of what nodes report, apart from operator decisions
PORTS = range(1024, 65536)
# node services that may serve a reservation: compute nodes (GPU servers, devices); never the
# storage node (docs/product-rules.md "Regional resources")
SERVING = frozenset({Service.COMPUTE.value})


def transition(
    session: Session, rsv: Reservation, to: ReservationState, *, actor: str, reason: str | None = None
) -> None:
    """The only way a reservation's desired state changes: checked against the table, audited."""
    lifecycle.apply(
        session, rsv, to, kind=KIND, name=rsv.name, table=RESERVATION_TRANSITIONS, actor=actor, reason=reason
    )


def _check_port(port: int) -> int:
    if port not in PORTS:
        raise InvalidInput(
            f"port {port} is out of range: use 1024-65535 (ports below 1024 need root on clients)",
            code="invalid_port",
        )
    return port


def _check_protocol(protocol: str) -> Protocol:
    try:
        return Protocol(protocol)
    except ValueError:
        raise InvalidInput(
            f"protocol '{protocol}' is not known: use tcp or udp", code="invalid_protocol"
        ) from None


def add(
    session: Session, name: str, *, region: str, hostname: str, port: int, protocol: str = "tcp", actor: str
) -> Reservation:
    names.dns_label("reservation", name)
    names.dns_label("reservation host", hostname)  # published as HOST.local: one label
    _check_port(port)
    proto = _check_protocol(protocol)
    reg = region_service.get(session, region)
    taken = [
        ("name", name, "choose another name"),
        ("hostname", hostname, "choose another --hostname"),
        ("port", port, "choose another --port"),
    ]
    for column, value, fix in taken:
        holder = regional_lookup.holder(session, Reservation, reg.id, **{column: value})
        if holder is not None:
            raise Conflict(
                f"{column} {value} is already used by reservation '{holder.name}' in region "
                f"'{reg.name}': {fix}",
                code=f"duplicate_{column}",
            )
    rsv = Reservation(
        id=new_id("rsv"), name=name, region=reg, hostname=hostname, port=port, protocol=proto.value
    )
    session.add(rsv)
    transition(
        session,
        rsv,
        ReservationState.UNASSIGNED,
        actor=actor,
        reason=f"added by operator: {hostname}.local port {port}/{proto.value}",
    )
    return rsv


def list_all(session: Session, region: str | None = None) -> list[Reservation]:
    return regional_lookup.list_live(session, Reservation, region)


def get(session: Session, ref: str, region: str | None = None) -> Reservation:
    """By id, or by name (unique per region; `region` disambiguates)."""
    return regional_lookup.get_live(session, Reservation, KIND, ref, region)


def _clear_actual(rsv: Reservation, to: ActualState | None) -> None:
    rsv.actual_state = to.value if to else None
    rsv.actual_reason = rsv.address = rsv.external_address = rsv.mdns = rsv.upnp = None
    rsv.reported_at = None


def assign(session: Session, ref: str, *, node: str, region: str | None = None, actor: str) -> Reservation:
    """Assign (or move) to a compute node of the reservation's region; the node's next heartbeat gets it."""
    rsv = get(session, ref, region)
    try:
        target = regional_lookup.get_live(session, Node, "node", node, rsv.region.name)
    except NotFound:
        elsewhere = session.scalar(
            select(Node).where((Node.name == node) | (Node.id == node), Node.state != NodeState.REMOVED)
        )
        if elsewhere is None:
            raise
        raise RuleViolation(
            f"node '{node}' is in region '{elsewhere.region.name}', not '{rsv.region.name}': assign "
            f"reservation '{rsv.name}' to a node of region '{rsv.region.name}'",
            code="node_in_other_region",
        ) from None
    if target.service not in SERVING:
        raise RuleViolation(
            f"node '{target.name}' is a {target.service} node: assign reservation '{rsv.name}' "
            f"to a compute node of region '{rsv.region.name}'",
            code="not_a_compute_node",
        )
    if rsv.node_id == target.id:
        return rsv  # already there: nothing to do, nothing to audit
    previous = rsv.node.name if rsv.node is not None else None
    rsv.node = target
    _clear_actual(rsv, ActualState.PENDING)
    why = (
        f"moved from node '{previous}' to node '{target.name}'"
        if previous
        else f"assigned to node '{target.name}'"
    )
    transition(session, rsv, ReservationState.ASSIGNED, actor=actor, reason=why)
    return rsv


def _detach(
    session: Session, rsv: Reservation, to: ReservationState, *, actor: str, reason: str
) -> Reservation:
    """Take the reservation off its node (the node drops it on its next heartbeat: mDNS goodbyes,
    UPnP mapping removed) and move it to `to`, audited."""
    rsv.node = None
    _clear_actual(rsv, None)
    transition(session, rsv, to, actor=actor, reason=reason)
    return rsv


def unassign_row(session: Session, rsv: Reservation, *, actor: str, reason: str | None = None) -> Reservation:
    """Unassign a loaded reservation: the operator's `unassign`, and node removal for each reservation
    the node served (nodes.transition), so both write the same state and history."""
    previous = rsv.node.name if rsv.node is not None else None
    return _detach(
        session,
        rsv,
        ReservationState.UNASSIGNED,
        actor=actor,
        reason=reason or f"unassigned from node '{previous}'",
    )


def unassign(session: Session, ref: str, *, region: str | None = None, actor: str) -> Reservation:
    return unassign_row(session, get(session, ref, region), actor=actor)


def unassign_from(session: Session, node: Node, *, actor: str, reason: str) -> list[Reservation]:
    """Unassign every reservation `node` serves (it is going away); each gets its own audit line."""
    return [unassign_row(session, rsv, actor=actor, reason=reason) for rsv in _assigned_to(session, node)]


def remove_row(
    session: Session, rsv: Reservation, *, actor: str, reason: str = "removed by operator"
) -> Reservation:
    return _detach(session, rsv, ReservationState.REMOVED, actor=actor, reason=reason)


def remove(session: Session, ref: str, *, region: str | None = None, actor: str) -> Reservation:
    return remove_row(session, get(session, ref, region), actor=actor)


def history(session: Session, ref: str, region: str | None = None) -> list[Any]:
    """Operator decisions and node reports of one reservation, oldest first."""
    rsv = get(session, ref, region)
    events = audit.history(session, KIND, [rsv.id]) + audit.history(session, ACTUAL_KIND, [rsv.id])
    return sorted(events, key=lambda e: e.id)


def _assigned_to(session: Session, node: Node) -> list[Reservation]:
    return list(
        session.scalars(
            select(Reservation)
            .where(Reservation.node_id == node.id, Reservation.state == ReservationState.ASSIGNED)
            .order_by(Reservation.name)
        )
    )


def _assigned_in_beat(session: Session, node: Node) -> list[Reservation]:
    """`_assigned_to`, asked once per heartbeat by the reporter and the contributor together (nothing
    between them assigns or unassigns a reservation: operator changes come in their own requests)."""
    return desired_state.memo(
        session, ("reservations.assigned", node.id), lambda: _assigned_to(session, node)
    )


@desired_state.contributes("upnp")
def upnp_for_node(session: Session, node: Node) -> bool:
    """The node's UPnP setting (`provision node add --no-upnp`); sent before `reservations` so the
    minion builds its agent with the right setting (minion/reservations/heartbeat.py)."""
    return bool(node.upnp)


@desired_state.contributes("reservations")
def desired_for_node(session: Session, node: Node) -> list[dict[str, Any]]:
    """What the node must serve: the wire shape of minion/reservations/model.py Reservation.from_dict."""
    return [
        {"name": r.name, "hostname": r.hostname, "port": r.port, "protocol": r.protocol}
        for r in _assigned_in_beat(session, node)
    ]


@desired_state.reports("reservations")
def record_actual(session: Session, node: Node, reported: Any) -> None:
    """Store each reported ReservationStatus on the reservation it belongs to. Reports about a
    reservation no longer assigned to this node (a move raced the heartbeat) are ignored, and an
    unknown state becomes `error` with the reason, so a bad report can't corrupt the row."""
    if not isinstance(reported, list):
        return
    mine = {r.name: r for r in _assigned_in_beat(session, node)}
    now = datetime.now(UTC)
    for item in reported:
        name = item.get("name") if isinstance(item, dict) else None
        rsv = mine.get(name) if isinstance(name, str) else None
        if rsv is None:
            continue
        try:
            state = ActualState(item.get("state"))
        except ValueError:
            state, item = (
                ActualState.ERROR,
                {"reason": f"the node reported an unknown state {item.get('state')!r}"},
            )
        before = rsv.actual_state
        rsv.actual_state = state.value
        rsv.actual_reason = item.get("reason")
        rsv.address, rsv.external_address = item.get("address"), item.get("external_address")
        rsv.mdns, rsv.upnp = item.get("mdns"), item.get("upnp")
        rsv.reported_at = now
        if before != state.value:
            audit.record(
                session,
                kind=ACTUAL_KIND,
                resource_id=rsv.id,
                name=rsv.name,
                actor=f"minion:{node.minion_id}",
                from_state=before,
                to_state=state.value,
                reason=rsv.actual_reason,
            )
    flush(session, f"the reservations of node '{node.name}'")
