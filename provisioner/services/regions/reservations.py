"""Reservations: a host name (published as HOST.local) and a port, unique per region, assigned to a
compute node of that region. The assignment reaches the node as desired state in its heartbeat
response (contributor `reservations`); the node's report comes back in the next heartbeat request
(reporter `reservations`) and is stored apart from the operator's decision (domain.states).

A job with `reservation:` serves it too, with no operator step: while the job's worker 0 is placed on a
node (starting or running), that node gets the reservation in its desired state exactly as an operator
assignment would, so it publishes HOST.local; when the job ends, is stopped or re-placed, the reservation
leaves that node's desired state (and the new node publishes it). The rule "one live job per reservation,
and none an operator assigned" (services.jobs) keeps it to one node. `expose_wan` (default off: LAN-only)
is the reservation's opt-in to a router mapping, made only by a node with UPnP on."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import and_, bindparam, exists, or_, select
from sqlalchemy.orm import Session, lazyload

from contracts.errors import Conflict, InvalidInput, NotFound, RuleViolation
from contracts.regional import Protocol
from contracts.reservations import ReservationSpec
from provisioner.domain.states import (
    JOB_LIVE,
    JOB_ON_NODE,
    RESERVATION_TRANSITIONS,
    WORKER_ON_NODE,
    ActualState,
    JobState,
    NodeState,
    ReservationState,
    Service,
    WorkerState,
)
from provisioner.services.common import audit, desired_state, lifecycle, names
from provisioner.services.common.errors import flush
from provisioner.services.regions import regional_lookup
from provisioner.services.regions import regions as region_service
from provisioner.store.expressions import one_of
from provisioner.store.job_models import Job, JobWorker
from provisioner.store.models import Node, new_id
from provisioner.store.regional_models import Reservation

KIND = "reservation"
ACTUAL_KIND = "reservation_actual"  # audit lines of what nodes report, apart from operator decisions
PORTS = range(1, 65536)  # an endpoint serves on 80 or 443 as readily as on 8080
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
            f"port {port} is out of range: use 1-65535",
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
    session: Session,
    name: str,
    *,
    region: str,
    hostname: str,
    port: int,
    protocol: str = "tcp",
    expose_wan: bool = False,
    actor: str,
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
        id=new_id("rsv"),
        name=name,
        region=reg,
        hostname=hostname,
        port=port,
        protocol=proto.value,
        expose_wan=expose_wan,
    )
    session.add(rsv)
    transition(
        session,
        rsv,
        ReservationState.UNASSIGNED,
        actor=actor,
        reason=f"added by operator: {hostname}.local port {port}/{proto.value}, {_wan_words(expose_wan)}",
    )
    return rsv


def _wan_words(expose_wan: bool) -> str:
    return "exposed on the WAN (UPnP)" if expose_wan else "LAN-only"


def set_expose_wan(
    session: Session, ref: str, *, expose_wan: bool, region: str | None = None, actor: str
) -> Reservation:
    """`reservation update --expose-wan/--no-expose-wan`: the node serving it maps (or unmaps) the router
    port on its next heartbeat; audited as a line of the reservation's history."""
    rsv = get(session, ref, region)
    if rsv.expose_wan == expose_wan:
        return rsv  # nothing to do, nothing to audit
    rsv.expose_wan = expose_wan
    if rsv.actual_state is not None:  # what the node reported no longer answers the new setting
        _clear_actual(rsv, ActualState.PENDING if rsv.state == ReservationState.ASSIGNED else None)
    audit.record(
        session,
        kind=KIND,
        resource_id=rsv.id,
        name=rsv.name,
        actor=actor,
        from_state=rsv.state,
        to_state=rsv.state,
        reason=f"now {_wan_words(expose_wan)}",
    )
    flush(session, f"reservation '{rsv.name}'")
    return rsv


def list_all(session: Session, region: str | None = None) -> list[Reservation]:
    return regional_lookup.list_live(session, Reservation, region)


def get(session: Session, ref: str, region: str | None = None) -> Reservation:
    """By id, or by name (unique per region; `region` disambiguates)."""
    return regional_lookup.get_live(session, Reservation, KIND, ref, region)


def _clear_actual(rsv: Reservation, to: ActualState | None) -> None:
    rsv.actual_state = to.value if to else None
    rsv.actual_reason = rsv.address = rsv.external_address = rsv.mdns = rsv.upnp = None
    rsv.reported_at = rsv.reported_by = None


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
    job = _live_job_of(session, rsv)
    if job is not None:  # the job's node publishes it: two nodes would answer for HOST.local
        raise Conflict(
            f"reservation '{rsv.name}' is used by job '{job.name}' ({job.state}) and moves with it: stop "
            f"the job first (`provision job stop {job.name}`), or use another reservation",
            code="reservation_in_use",
        )
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
        session.scalars(select(Reservation).where(_operator_assigned(node.id)).order_by(Reservation.name))
    )


def _job_reservation() -> Any:
    """The `reservation:` of a job's spec, as SQL (JSON ->> on PostgreSQL, json_extract on SQLite)."""
    return Job.spec["reservation"].as_string()


def _operator_assigned(node_id: Any) -> Any:
    """Reservations an operator assigned to `node_id`."""
    return and_(Reservation.node_id == node_id, Reservation.state == ReservationState.ASSIGNED)


def _publishing_worker_0(node_id: Any) -> Any:
    """Worker 0 placed on `node_id` and meant to run there: the node that publishes the job's reservation."""
    return and_(
        JobWorker.index == 0,
        JobWorker.node_id == node_id,
        one_of(JobWorker.state, [s.value for s in WORKER_ON_NODE]),
        JobWorker.stop_requested.is_(False),
    )


# What a node must publish, in ONE statement: the reservations an operator assigned to it, and those of its
# region whose live job has worker 0 placed on it (starting or running). Built once with bound parameters:
# it is asked on every heartbeat, and building it (a dozen expressions, a subquery) and computing its cache
# key cost more than running it. The reservation's region and node are the beating node's own, already in
# the session, so they are not joined again (with their regions' providers) as `lazy="joined"` would.
_SERVED_BY = (
    select(Reservation)
    .where(
        Reservation.region_id == bindparam("region_id"),
        or_(
            _operator_assigned(bindparam("node_id")),
            and_(
                Reservation.state == ReservationState.UNASSIGNED,
                Reservation.name.in_(
                    select(_job_reservation())
                    .select_from(Job)
                    .join(JobWorker, JobWorker.job_id == Job.id)
                    .where(
                        Job.pinned_region_id == bindparam("region_id"),
                        Job.state.in_([s.value for s in JOB_ON_NODE]),
                        _publishing_worker_0(bindparam("node_id")),
                    )
                ),
            ),
        ),
    )
    .order_by(Reservation.name)
    .options(lazyload("*"))
)


SERVED_READ = "reservations.served"


def could_serve(node_id: Any) -> Any:
    """Whether `_SERVED_BY` could find anything for the node `node_id` (a column it correlates to): a
    reservation is assigned to it, or worker 0 of a job is placed there."""
    return or_(
        exists().where(_operator_assigned(node_id)),
        exists().where(_publishing_worker_0(node_id)),
    )


def _served_by(session: Session, node: Node) -> list[Reservation]:
    return list(session.scalars(_SERVED_BY, {"region_id": node.region_id, "node_id": node.id}))


def _served_in_beat(session: Session, node: Node) -> list[Reservation]:
    """`_served_by`, asked once per heartbeat by the reporter and the contributor together (nothing
    between them assigns or unassigns a reservation or places a job: those come in their own requests),
    and not at all when the beat's first query found nothing to serve (`could_serve`)."""
    return desired_state.memo(
        session,
        (SERVED_READ, node.id),
        lambda: [] if desired_state.nothing_to_read(session, SERVED_READ) else _served_by(session, node),
    )


@dataclass(frozen=True)
class JobServing:
    """The live job that holds a reservation, and the node publishing it (None while the job waits)."""

    job: Job
    node: Node | None


def _live_job_of(session: Session, rsv: Reservation) -> Job | None:
    """The live job (waiting, starting, running) whose spec names `rsv`: one at most (services.jobs)."""
    return session.scalars(
        select(Job)
        .where(
            Job.pinned_region_id == rsv.region_id,
            Job.state.in_([s.value for s in JOB_LIVE]),
            _job_reservation() == rsv.name,
        )
        .order_by(Job.created_at)
        .limit(1)
    ).first()


def serving_jobs(session: Session, rows: list[Reservation]) -> dict[str, JobServing]:
    """For `reservation show`/`list`: the live job of each reservation that has one (by reservation id),
    with worker 0's node while it publishes there."""
    regions = {r.region_id for r in rows}
    if not regions:
        return {}
    jobs = session.scalars(
        select(Job).where(
            Job.pinned_region_id.in_(sorted(regions)),
            Job.state.in_([s.value for s in JOB_LIVE]),
            _job_reservation().is_not(None),
        )
    )
    by_key = {(j.pinned_region_id, str(j.spec.get("reservation"))): j for j in jobs}
    out: dict[str, JobServing] = {}
    for rsv in rows:
        job = by_key.get((rsv.region_id, rsv.name))
        if job is None:
            continue
        worker0 = next((w for w in job.workers if w.index == 0), None)
        publishing = (
            worker0 is not None
            and JobState(job.state) in JOB_ON_NODE
            and WorkerState(worker0.state) in WORKER_ON_NODE
            and not worker0.stop_requested
        )
        # by id: the jobs service places a worker by setting node_id, which a loaded `node` does not follow
        node = session.get(Node, worker0.node_id) if publishing and worker0 and worker0.node_id else None
        out[rsv.id] = JobServing(job, node)
    return out


def actual_is_current(rsv: Reservation, serving: JobServing | None) -> bool:
    """Whether the stored actual_* describe what serves the reservation now: an operator assignment
    clears them when it changes; a job's reservation moves without that, so a report counts only from
    the node that publishes it now, made for this job."""
    if rsv.state == ReservationState.ASSIGNED:
        return True
    if serving is None or serving.node is None or rsv.reported_at is None:
        return False
    return rsv.reported_by == serving.node.id and rsv.reported_at >= serving.job.created_at


def upnp_for_node(session: Session, node: Node) -> bool:
    """The node's UPnP setting (`provision node add --no-upnp`); sent before `reservations` so the
    minion builds its agent with the right setting (minion/reservations/heartbeat.py)."""
    return bool(node.upnp)


def desired_for_node(session: Session, node: Node) -> list[dict[str, Any]]:
    """What the node must serve (assigned by an operator, or held by a job whose worker 0 it runs): the
    wire shape of contracts/reservations.py ReservationSpec. `expose_wan`: the node maps the
    port on the router only when true and its UPnP is on."""
    return [
        ReservationSpec(r.name, r.hostname, r.port, Protocol(r.protocol), bool(r.expose_wan)).to_dict()
        for r in _served_in_beat(session, node)
    ]


def record_actual(session: Session, node: Node, reported: Any) -> None:
    """Store each reported ReservationStatus on the reservation it belongs to. Reports about a
    reservation this node no longer serves (a move or a job's re-placement raced the heartbeat) are
    ignored, and an unknown state becomes `error` with the reason, so a bad report can't corrupt the row."""
    if not isinstance(reported, list):
        return
    mine = {r.name: r for r in _served_in_beat(session, node)}
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
        if rsv.state != ReservationState.ASSIGNED and rsv.reported_by != node.id:
            before = ActualState.PENDING.value  # a job's reservation, first report from this node
        rsv.actual_state = state.value
        rsv.actual_reason = item.get("reason")
        rsv.address, rsv.external_address = item.get("address"), item.get("external_address")
        rsv.mdns, rsv.upnp = item.get("mdns"), item.get("upnp")
        rsv.reported_at, rsv.reported_by = now, node.id
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
