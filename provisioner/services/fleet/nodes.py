"""Nodes: add by minion_id, list (paginated), show, remove, replace (storage), maintenance, history.

`transition()` is THE way a node's state changes — operator commands here, the join protocol and
the reconcilers all call it — so the transition table, row locking and the audit trail apply to
every change. Non-state facts a minion reports (heartbeat time, inventory, requirement verdict)
go through `record_report()`; they never touch `state`."""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import CursorResult, Executable, Text, bindparam, cast, inspect, select, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from contracts.errors import Conflict, InvalidInput, NotFound, RuleViolation
from contracts.regional import StorageMode
from provisioner.domain.pages import NODES_PAGE
from provisioner.domain.states import (
    NODE_AWAITING_MINION,
    NODE_TRANSITIONS_BY_SERVICE,
    Maintenance,
    NodeState,
    RegionState,
    Service,
)
from provisioner.providers.physical import PhysicalProvider
from provisioner.services.common import audit, lifecycle, names
from provisioner.services.common.errors import changed_meanwhile, flush
from provisioner.services.regions import regional_lookup, reservations
from provisioner.services.regions import regions as region_service
from provisioner.store import row_scope
from provisioner.store.join_models import NodeAttestation
from provisioner.store.models import AuditEvent, Node, Region, new_id

KIND = "node"


def lock(session: Session, node: Node) -> Node:
    """Re-read the row under SELECT … FOR UPDATE (PostgreSQL; a no-op on SQLite, which serialises
    writers itself). A concurrent transition waits here and then sees the winner's state; the
    version column catches anything that slips past (e.g. a node loaded in an earlier unit of work)."""
    if inspect(node).persistent:
        # of=Node: lock only the node row, not its (eagerly joined) region and provider
        session.execute(
            select(Node)
            .where(Node.id == node.id)
            .with_for_update(of=Node)
            .execution_options(populate_existing=True)
        )
    return node


def transition(session: Session, node: Node, to: NodeState, *, actor: str, reason: str | None = None) -> Node:
    """Move `node` to `to`: refused naming the current state when the table forbids it; recorded in
    the audit trail (who, when, from, to, why); flushed so that a lost race is a Conflict here."""
    lock(session, node)
    table = NODE_TRANSITIONS_BY_SERVICE[Service(node.service)]  # a device has no maintenance step
    lifecycle.apply(session, node, to, kind=KIND, name=node.name, table=table, actor=actor, reason=reason)
    if to == NodeState.REMOVED:
        # every removal path (operator, replace, forced region removal, a provider deleting its VM)
        # comes through here: a removed node serves nothing, so its reservations must not stay
        # assigned to it where no heartbeat will ever pick them up again
        reservations.unassign_from(session, node, actor=actor, reason=f"node '{node.name}' was removed")
    return node


def record_report(
    session: Session,
    node: Node,
    *,
    at: datetime | None = None,
    inventory: dict[str, Any] | None = None,
    requirements: dict[str, Any] | None = None,
) -> Node:
    """A heartbeat or join report: updates last_heartbeat_at (hence `online`), inventory, verdict."""
    node.last_heartbeat_at = at or datetime.now(UTC)
    if inventory is not None:
        node.inventory = inventory
    if requirements is not None:
        node.requirements = requirements
    flush(session, f"node '{node.name}'")
    return node


# The columns a beat may write beside its time and count, each set its own cached statement (see record_beat)
_BEAT_COLUMNS = ("inventory", "requirements")


@functools.cache
def _beat_update(columns: frozenset[str]) -> Executable:
    table = Node.metadata.tables[Node.__tablename__]  # the Table itself: Core, not the ORM
    c = table.c
    return (
        update(table)
        .where(c.id == bindparam("b_id"), c.version == bindparam("b_version"))
        .values(
            last_heartbeat_at=bindparam("b_at", type_=c.last_heartbeat_at.type),
            updated_at=bindparam("b_at", type_=c.updated_at.type),
            heartbeats=bindparam("b_heartbeats"),
            version=bindparam("b_next_version"),
            **{name: bindparam(f"b_{name}", type_=c[name].type) for name in sorted(columns)},
        )
    )


def record_beat(
    session: Session,
    node: Node,
    *,
    at: datetime,
    inventory: dict[str, Any] | None = None,
    requirements: dict[str, Any] | None = None,
) -> None:
    """A heartbeat's report, as record_report stores it, and the beat counted (Node.heartbeats): ONE
    statement, built once per set of columns, instead of the ORM's flush of the changed object (a third
    of a steady beat's unit of work at 333 beats/s). It checks and bumps `version`
    as the ORM does, so a concurrent change of the row is a Conflict here, and leaves `node` as if the
    ORM had written it (nothing pending, the new values loaded)."""
    reported = {"inventory": inventory, "requirements": requirements}
    values: dict[str, Any] = {"last_heartbeat_at": at, "updated_at": at, "heartbeats": node.heartbeats + 1}
    values |= {c: v for c, v in reported.items() if v is not None}
    params = {f"b_{c}": v for c, v in values.items() if c in _BEAT_COLUMNS}
    statement = _beat_update(frozenset(c for c in _BEAT_COLUMNS if c in values))
    result = session.execute(
        statement,
        {
            "b_id": node.id,
            "b_version": node.version,
            "b_at": at,
            "b_heartbeats": values["heartbeats"],
            "b_next_version": node.version + 1,
            **params,
        },
    )
    if not isinstance(result, CursorResult) or result.rowcount != 1:
        raise changed_meanwhile(f"node '{node.name}'")
    for column, value in {**values, "version": node.version + 1}.items():
        set_committed_value(node, column, value)


def last_quote_at(session: Session, node: Node) -> datetime | None:
    """When the node's last continuous-attestation quote verified (None: none since its join)."""
    att = session.get(NodeAttestation, node.id)
    return att.last_quote_at if att is not None else None


def identity(session: Session, node: Node) -> str | None:
    """What the node's minion proved itself with at its last join (MinionIdentity), None before one."""
    att = session.get(NodeAttestation, node.id)
    return att.identity if att is not None else None


def by_minion_id(session: Session, minion_id: str) -> Node | None:
    """The live node an operator added for this minion_id (the join protocol's lookup), or None."""
    return session.scalar(select(Node).where(Node.minion_id == minion_id, Node.state != NodeState.REMOVED))


def _refuse_taken_minion_id(session: Session, minion_id: str) -> None:
    """One live node per minion_id in the whole fleet; a holder in a region the caller cannot see is not
    named (nor is its account)."""
    held = session.execute(
        select(Region.account_id)
        .join(Node, Node.region_id == Region.id)
        .where(Node.minion_id == minion_id, Node.state != NodeState.REMOVED)
        .execution_options(**row_scope.UNSCOPED)
    ).first()
    if held is not None and not row_scope.sees(session, held.account_id):
        raise Conflict(
            f"minion_id {minion_id} is held by a node of another account: check the id on the banner, or "
            "ask the fleet's operators (a root admin) to release it",
            code="duplicate_minion_id",
        )
    holder = by_minion_id(session, minion_id)
    if holder is not None:
        raise Conflict(
            f"minion_id {minion_id} is already held by node '{holder.name}' in region "
            f"'{holder.region.name}': remove that node first or check the id on the banner",
            code="duplicate_minion_id",
        )


def storage_node(session: Session, region: Region) -> Node | None:
    return regional_lookup.holder(session, Node, region.id, service=Service.STORAGE)


def add_vm_node(
    session: Session, region: Region, name: str, *, minion_id: str, service: Service, actor: str, reason: str
) -> Node:
    """The node of a VM a provider makes (a GCP storage node, burst VM or permanent compute node): new,
    no UPnP or mining (a cloud VM has neither), with the placeholder minion_id its vTPM's EK replaces."""
    node = Node(
        id=new_id("node"),
        name=name,
        region=region,
        minion_id=minion_id,
        service=service.value,
        upnp=False,
        mining=False,
    )
    session.add(node)
    transition(session, node, NodeState.NEW, actor=actor, reason=reason)
    return node


def refuse_node_name_taken(session: Session, reg: Region, name: str) -> None:
    if regional_lookup.holder(session, Node, reg.id, name=name) is not None:
        raise Conflict(
            f"node '{name}' already exists in region '{reg.name}': choose another name", code="duplicate_name"
        )


def refuse_compute_without_active_storage(reg: Region, storage: Node | None) -> None:
    """A compute node in a central-storage region needs the region's storage node active first."""
    if reg.storage_mode == StorageMode.CENTRAL:
        _refuse_without_active_storage(reg, storage)


def _refuse_without_active_storage(
    region: Region, storage: Node | None, added: str = "compute nodes"
) -> None:
    """A compute node of a central region mounts its storage node's cache at finalize, so that node must
    be serving (active) before a compute node (or a device) is added (docs/product-rules.md)."""
    if storage is None:
        raise RuleViolation(
            f"region '{region.name}' uses central storage and has no storage node yet: add it first "
            f"with `provision node add NAME --region {region.name} --service storage --minion-id ID`",
            code="storage_node_first",
        )
    if storage.state != NodeState.ACTIVE:
        raise RuleViolation(
            f"region '{region.name}' uses central storage and its storage node '{storage.name}' is "
            f"{storage.state}, not active: add {added} once it is "
            f"(`provision node show {storage.name}`)",
            code="storage_node_not_active",
        )


def _refuse_device_region(region: Region) -> None:
    """docs/product-rules.md, "Devices": only physical regions configured with a central storage node take
    devices; a region in local storage mode cannot become one, so the way out is a new region."""
    if region.provider.kind != PhysicalProvider.kind:
        raise RuleViolation(
            f"region '{region.name}' is a {region.provider.kind} region: devices need a physical "
            "central-storage region; create one with `provision region create NAME --provider physical "
            "--storage-mode central` to add devices",
            code="device_region_not_physical",
        )
    if region.storage_mode != StorageMode.CENTRAL:
        raise RuleViolation(
            f"region {region.name} uses {region.storage_mode} storage: devices need a central-storage "
            "region; create a new region to add devices",
            code="device_region_local_storage",
        )


def _service(value: str) -> Service:
    try:
        return Service(value)
    except ValueError:
        known = ", ".join(s.value for s in Service)
        raise InvalidInput(f"service '{value}' is not known: use one of {known}") from None


def add(
    session: Session,
    name: str,
    *,
    region: str,
    minion_id: str,
    service: str = Service.COMPUTE.value,
    hostname: str | None = None,
    upnp: bool = True,
    mining: bool = False,
    actor: str,
) -> Node:
    names.dns_label("node", name)
    names.minion_id(minion_id)
    svc = _service(service)
    if hostname is not None:
        names.hostname(hostname)
    reg = region_service.get(session, region)
    if reg.state == RegionState.REMOVING:
        raise RuleViolation(f"region '{reg.name}' is being removed: add the node to another region")
    if svc == Service.DEVICE:
        _refuse_device_region(reg)
    refuse_node_name_taken(session, reg, name)
    _refuse_taken_minion_id(session, minion_id)
    existing_storage = storage_node(session, reg)
    if svc == Service.STORAGE and existing_storage is not None:
        raise Conflict(
            f"region '{reg.name}' already has storage node '{existing_storage.name}': swap it with "
            f"`provision node replace {existing_storage.name} --minion-id NEW`",
            code="second_storage_node",
        )
    if svc == Service.STORAGE and reg.storage_mode != StorageMode.CENTRAL:
        raise RuleViolation(
            f"region '{reg.name}' uses {reg.storage_mode} storage: storage nodes serve only regions in "
            "central storage mode; add this node as compute, or to a central region",
            code="storage_node_in_local_region",
        )
    if svc == Service.DEVICE:
        _refuse_without_active_storage(reg, existing_storage, "devices")
    if svc == Service.COMPUTE:
        refuse_compute_without_active_storage(reg, existing_storage)
    node = Node(
        id=new_id("node"),
        name=name,
        region=reg,
        minion_id=minion_id,
        service=svc.value,
        hostname=hostname,
        upnp=upnp,
        mining=mining,
    )
    session.add(node)
    transition(
        session, node, NodeState.NEW, actor=actor, reason=f"added by operator with minion_id {minion_id}"
    )
    return node


# The columns of a node list row. The reports are read as the JSON text the store holds (`*_json`): the
# list splices that text into its answer (provisioner/api/node_page.py), because decoding and re-encoding
# ~6 KiB of reports per node was most of the time a page of 500 took.
LIST_COLUMNS = (
    Node.id,
    Node.name,
    Node.region_id,
    Node.minion_id,
    Node.service,
    Node.hostname,
    Node.upnp,
    Node.mining,
    Node.state,
    Node.reason,
    Node.last_heartbeat_at,
    Node.finalize_applied,
    Node.finalize_retry,
    Node.created_at,
    Node.updated_at,
    Node.version,
    cast(Node.inventory, Text).label("inventory_json"),
    cast(Node.requirements, Text).label("requirements_json"),
    cast(Node.finalize_actual, Text).label("finalize_actual_json"),
    cast(Node.object_cache, Text).label("object_cache_json"),
    cast(Node.gpu_health, Text).label("gpu_health_json"),
)


@functools.lru_cache(maxsize=256)
def _page_statement(
    *, rows: int, removed: bool, region: bool, service: bool, after: bool, account: bool
) -> Executable:
    """A list page's statement for one page size and combination of filters, built once with bound
    parameters (region_id, service, after): building and keying it anew took a tenth of a page's time.
    The size stays a literal: PostgreSQL plans a prepared `LIMIT $1` without knowing it is small."""
    stmt = (
        select(
            *LIST_COLUMNS,
            Region.name.label("region_name"),
            NodeAttestation.last_quote_at,
            NodeAttestation.identity,
        )
        .join(Region, Region.id == Node.region_id)
        .outerjoin(NodeAttestation, NodeAttestation.node_id == Node.id)
        .order_by(Node.id)
        .limit(rows)
    )
    if not removed:
        stmt = stmt.where(Node.state != NodeState.REMOVED)
    if region:
        stmt = stmt.where(Node.region_id == bindparam("region_id"))
    if service:  # `provision device list` pages through devices only, not the whole fleet
        stmt = stmt.where(Node.service == bindparam("service"))
    if after:
        stmt = stmt.where(Node.id > bindparam("after"))
    if account:  # a Core statement: the session's row scope (store/row_scope.py) is applied here by hand
        stmt = stmt.where(Region.account_id == bindparam("account_id"))
    return stmt


def list_page(
    session: Session,
    *,
    region: str | None = None,
    limit: int = 100,
    after: str | None = None,
    include_removed: bool = False,
    service: str | None = None,
) -> tuple[list[Any], str | None]:
    """One page ordered by id (keyset pagination: page N costs the same as page 1) and the cursor
    of the next page (None at the end). Items are read-only rows of LIST_COLUMNS plus `region_name`,
    `last_quote_at` and `identity` — no ORM objects, and the reports undecoded, so a page of 500 stays
    cheap; use get() to change a node."""
    if not 1 <= limit <= NODES_PAGE:
        raise InvalidInput(f"limit {limit} is out of range: use 1 to {NODES_PAGE}")
    params: dict[str, Any] = {}
    if region:
        params["region_id"] = region_service.get(session, region).id
    if service:
        params["service"] = _service(service).value
    if after:
        params["after"] = after
    if (account_id := row_scope.scoped_account(session)) is not None:
        params["account_id"] = account_id
    stmt = _page_statement(
        rows=limit + 1,
        removed=include_removed,
        region="region_id" in params,
        service="service" in params,
        after="after" in params,
        account="account_id" in params,
    )
    # on the session's connection: plain rows, without the ORM's per-row loading work
    rows = list(session.connection().execute(stmt, params).all())
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, (rows[-1].id if more else None)


def get(session: Session, ref: str, region: str | None = None, *, include_removed: bool = False) -> Node:
    """By id, or by name (unique per region; `region` disambiguates a name used in two regions)."""
    stmt = select(Node).where((Node.name == ref) | (Node.id == ref))
    if region:
        stmt = stmt.where(Node.region_id == region_service.get(session, region).id)
    found = list(session.scalars(stmt.where(Node.state != NodeState.REMOVED)))
    if not found:
        gone = session.scalars(stmt.order_by(Node.created_at.desc()).limit(1)).first()
        if gone is not None and include_removed:
            found = [gone]
        elif gone is not None:  # a removed node is history, not nothing: say where to see it
            raise NotFound(
                f"node '{ref}' was removed ({gone.id}): see it with `provision node history {gone.id}`, "
                "or `provision node list --removed`",
                code="node_not_found",
            )
    return names.one_named(
        found, kind=KIND, ref=ref, place=lambda n: n.region.name, scope="regions", option="--region"
    )


def remove(session: Session, ref: str, *, region: str | None = None, actor: str, force: bool = False) -> Node:
    """Remove a node. A central region's storage node serves the cache its compute nodes mount: removing it
    while they are there needs `force`, and the refusal lists what would lose its cache."""
    node = get(session, ref, region)
    if node.service == Service.STORAGE and not force:
        users = list(
            session.scalars(
                select(Node.name)
                .where(
                    Node.region_id == node.region_id,
                    Node.service == Service.COMPUTE,
                    Node.state != NodeState.REMOVED,
                )
                .order_by(Node.name)
            )
        )
        if users:
            shown = ", ".join(users[:10]) + (f" and {len(users) - 10} more" if len(users) > 10 else "")
            raise RuleViolation(
                f"storage node '{node.name}' serves the cache of {len(users)} compute node(s) in region "
                f"'{node.region.name}' ({shown}): replace it (`provision node replace`), or remove it with "
                "--force and they lose their cache",
                code="storage_node_in_use",
            )
    why = "removed by operator" + (" (--force: its compute nodes lose their cache)" if force else "")
    return transition(session, node, NodeState.REMOVED, actor=actor, reason=why)


def replace(session: Session, ref: str, *, minion_id: str, region: str | None = None, actor: str) -> Node:
    """Swap a storage node's hardware: the old node is removed, a new one with the same name and
    settings waits for the new minion. Compute nodes are simply removed and added instead."""
    names.minion_id(minion_id)
    old = get(session, ref, region)
    if old.service != Service.STORAGE:
        raise RuleViolation(
            f"node '{old.name}' is a compute node; only storage nodes are replaced: "
            "remove it and add the new node instead",
            code="replace_compute",
        )
    _refuse_taken_minion_id(session, minion_id)
    transition(session, old, NodeState.REMOVED, actor=actor, reason=f"replaced by minion_id {minion_id}")
    new = Node(
        id=new_id("node"),
        name=old.name,
        region=old.region,
        minion_id=minion_id,
        service=old.service,
        hostname=old.hostname,
        upnp=old.upnp,
        mining=old.mining,
    )
    session.add(new)
    transition(
        session, new, NodeState.NEW, actor=actor, reason=f"replaces node {old.id} (minion_id {old.minion_id})"
    )
    return new


def maintenance(
    session: Session, ref: str, mode: str, *, region: str | None = None, actor: str, reason: str | None = None
) -> Node:
    """on: active → maintenance; off: maintenance → active; toggle picks by the current state."""
    try:
        wanted = Maintenance(mode)
    except ValueError:
        raise InvalidInput(f"maintenance mode '{mode}' is not known: use on, off or toggle") from None
    node = lock(session, get(session, ref, region))
    if wanted == Maintenance.TOGGLE:
        wanted = Maintenance.OFF if node.state == NodeState.MAINTENANCE else Maintenance.ON
    target = NodeState.MAINTENANCE if wanted == Maintenance.ON else NodeState.ACTIVE
    if node.state == target:
        return node  # already there: asking again is not an error (the CLI says so), and nothing is written
    if node.service == Service.DEVICE:
        raise RuleViolation(
            f"node '{node.name}' is a device: devices have no maintenance mode (they take no jobs and enter "
            f"active when provisioned); see `provision device show {node.name}`",
            code="device_no_maintenance",
        )
    if node.state in NODE_AWAITING_MINION:
        raise RuleViolation(
            f"node '{node.name}' is {node.state}: it waits for its minion to join and finalize, so it has no "
            "maintenance mode yet; see `provision node pending` and `provision node refusals`",
            code="node_not_ready",
        )
    why = reason or f"maintenance {wanted.value} by operator"
    return transition(session, node, target, actor=actor, reason=why)


def history(session: Session, ref: str, region: str | None = None) -> tuple[Node, list[AuditEvent]]:
    """The node's events plus those of the nodes it replaced (same name in the same region)."""
    node = get(session, ref, region, include_removed=True)
    ids = list(
        session.scalars(select(Node.id).where(Node.region_id == node.region_id, Node.name == node.name))
    )
    return node, audit.history(session, KIND, ids)
