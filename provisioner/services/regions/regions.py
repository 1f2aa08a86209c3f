"""Regions: create (DNS-label name unique per provider), list, show. Removal, which reaches into the
region's nodes, reservations and datastores, is services/fleet/region_removal.py: those modules look regions
up here, so this module imports none of them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.orm import Session

from contracts.errors import Conflict, InvalidInput, NotFound
from contracts.regional import StorageMode
from provisioner.domain.roles import Action, Principal
from provisioner.domain.states import REGION_TRANSITIONS, NodeState, ProviderState, RegionState
from provisioner.services.common import audit, lifecycle, names
from provisioner.services.common.account_lookup import root_account
from provisioner.services.common.runtime import runtime_of
from provisioner.services.regions import providers as provider_service
from provisioner.store.models import JOBS_LAN, Node, Provider, Region, new_id

KIND = "region"


def transition(
    session: Session, region: Region, to: RegionState, *, actor: str, reason: str | None = None
) -> None:
    """The only way a region's state changes: checked against the table, recorded in the audit trail."""
    lifecycle.apply(
        session, region, to, kind=KIND, name=region.name, table=REGION_TRANSITIONS, actor=actor, reason=reason
    )


def create(
    session: Session,
    name: str,
    *,
    provider: str,
    storage_mode: str = StorageMode.LOCAL.value,
    public_jobs: bool = True,
    options: Mapping[str, Any] | None = None,
    actor: str,
    account_id: str | None = None,
) -> Region:
    """`account_id`: the owner, the creating token's account (None: the root account)."""
    names.dns_label("region", name)
    try:
        mode = StorageMode(storage_mode)
    except ValueError:
        raise InvalidInput(f"storage mode '{storage_mode}' is not known: use local or central") from None
    prov = provider_service.get(session, provider)
    if prov.state != ProviderState.ENABLED:
        raise Conflict(
            f"provider '{prov.kind}' is {prov.state}, not enabled: "
            f"wait for it or see `provision provider show {prov.kind}`"
        )
    settings = (
        runtime_of(session)
        .provider(prov.kind)
        .validate_region(name, {**(options or {}), "storage_mode": mode.value, "public_jobs": public_jobs})
    )
    if session.scalar(
        select(Region.id).where(
            Region.provider_id == prov.id, Region.name == name, Region.state != RegionState.REMOVED
        )
    ):
        raise Conflict(
            f"region '{name}' already exists for provider '{prov.kind}': choose another name",
            code="duplicate_name",
        )
    region = Region(
        id=new_id("reg"),
        name=name,
        provider=prov,
        storage_mode=mode.value,
        public_jobs=public_jobs,
        settings=settings,
        account_id=account_id or root_account(session).id,
    )
    session.add(region)
    transition(session, region, RegionState.NEW, actor=actor, reason="created by operator")
    return region


def list_all(session: Session, provider: str | None = None) -> list[Region]:
    stmt = select(Region).where(Region.state != RegionState.REMOVED).order_by(Region.name)
    if provider:
        stmt = stmt.where(Region.provider_id == provider_service.get(session, provider).id)
    return list(session.scalars(stmt))


def get(session: Session, ref: str, provider: str | None = None) -> Region:
    """By id, or by name (unique per provider; `provider` disambiguates when two providers share it)."""
    stmt = select(Region).where(
        (Region.name == ref) | (Region.id == ref), Region.state != RegionState.REMOVED
    )
    if provider:
        stmt = stmt.join(Provider).where((Provider.kind == provider) | (Provider.id == provider))
    return names.one_named(
        list(session.scalars(stmt)),
        kind=KIND,
        ref=ref,
        place=lambda r: r.provider.kind,
        scope="providers",
        option="--provider",
    )


def live_nodes(session: Session, region: Region) -> list[Node]:
    return list(
        session.scalars(
            select(Node)
            .where(Node.region_id == region.id, Node.state != NodeState.REMOVED)
            .order_by(Node.name)
        )
    )


def _live_where(
    region: Region, service: str | None, name_contains: str, state: str
) -> list[ColumnElement[bool]]:
    where = [Node.region_id == region.id, Node.state != NodeState.REMOVED]
    if service is not None:
        where.append(Node.service == service)
    if name_contains:  # node names are DNS labels: lower case
        where.append(Node.name.contains(name_contains.lower(), autoescape=True))
    if state:
        where.append(Node.state == state)
    return where


def count_live_nodes(
    session: Session, region: Region, service: str | None = None, name_contains: str = "", state: str = ""
) -> int:
    """How many of the region's live nodes (of `service`; None: any) match the filter (the console)."""
    where = _live_where(region, service, name_contains, state)
    return session.scalar(select(func.count()).select_from(Node).where(*where)) or 0


def live_nodes_page(
    session: Session,
    region: Region,
    service: str,
    *,
    offset: int,
    limit: int,
    name_contains: str = "",
    state: str = "",
) -> list[Node]:
    """One page, by name, of the region's live nodes of `service` that match the filter: the database
    pages, so a region of 10,000 nodes loads only the rows shown."""
    where = _live_where(region, service, name_contains, state)
    return list(session.scalars(select(Node).where(*where).order_by(Node.name).offset(offset).limit(limit)))


def live_node_names(session: Session, region: Region, service: str) -> list[tuple[str, str]]:
    """(id, name) of every live node of `service` in the region, by name: no node row is loaded."""
    where = _live_where(region, service, "", "")
    return [(i, n) for i, n in session.execute(select(Node.id, Node.name).where(*where).order_by(Node.name))]


def _owned(session: Session, ref: str, principal: Principal, action: Action) -> Region:
    """The region, for its own account's admins (a root admin for any); another account's looks missing."""
    principal.require(action)
    region = get(session, ref)
    scope = principal.account_scope()
    if scope is not None and region.account_id != scope:
        raise NotFound(
            f"{KIND} '{ref}' does not exist: see `provision {KIND} list`", code=f"{KIND}_not_found"
        )
    return region


def _noted(session: Session, region: Region, principal: Principal, reason: str) -> None:
    """A changed setting, as a line in the region's audit trail."""
    audit.note(
        session,
        kind=KIND,
        resource_id=region.id,
        name=region.name,
        actor=principal.actor,
        state=region.state,
        reason=reason,
    )
    session.flush()


def set_jobs_lan(session: Session, ref: str, jobs_lan: bool, *, principal: Principal) -> Region:
    """Let the region's jobs reach the LAN (its datastores' and peers' addresses), or close it again; the
    node itself and a cloud's metadata server stay closed either way. The region's admins decide; the
    nodes apply it with their next heartbeat, to running jobs too."""
    region = _owned(session, ref, principal, Action.MANAGE_FLEET)
    if region.jobs_lan != jobs_lan:
        region.settings = {**(region.settings or {}), JOBS_LAN: jobs_lan}
        _noted(
            session,
            region,
            principal,
            "jobs " + ("may reach the LAN" if jobs_lan else "no longer reach the LAN"),
        )
    return region


def set_public_jobs(session: Session, ref: str, public_jobs: bool, *, principal: Principal) -> Region:
    """Sell the region's spare capacity to other accounts' jobs, or stop (docs/billing.md "Public jobs").
    Its account's admins decide (a root admin for any region); another account's region looks missing.
    Jobs already placed keep running where they are: the setting is read when a job is placed."""
    region = _owned(session, ref, principal, Action.SELL_CAPACITY)
    if region.public_jobs != public_jobs:
        region.public_jobs = public_jobs
        _noted(
            session,
            region,
            principal,
            "public jobs " + ("allowed: spare capacity is sold" if public_jobs else "no longer allowed"),
        )
    return region
