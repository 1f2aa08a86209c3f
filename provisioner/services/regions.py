"""Regions: create (DNS-label name unique per provider), list, show, remove (refused while nodes,
reservations or datastores exist unless forced, in which case they are removed first, each with its
own history line)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import event, select
from sqlalchemy.orm import Session

from provisioner.errors import Conflict, InvalidInput
from provisioner.providers.base import provider_for
from provisioner.reconcilers.loop import kick
from provisioner.services import lifecycle, names
from provisioner.services import providers as provider_service
from provisioner.states import REGION_TRANSITIONS, NodeState, ProviderState, RegionState, StorageMode
from provisioner.store.models import Node, Provider, Region, new_id

KIND = "region"


def transition(session: Session, region: Region, to: RegionState, *, actor: str, reason: str | None = None) -> None:
    """The only way a region's state changes: checked against the table, recorded in the audit trail."""
    lifecycle.apply(session, region, to, kind=KIND, name=region.name, table=REGION_TRANSITIONS,
                    actor=actor, reason=reason)


def create(
    session: Session, name: str, *, provider: str, storage_mode: str = StorageMode.LOCAL.value,
    public_jobs: bool = True, options: Mapping[str, Any] | None = None, actor: str,
) -> Region:
    names.dns_label("region", name)
    try:
        mode = StorageMode(storage_mode)
    except ValueError:
        raise InvalidInput(f"storage mode '{storage_mode}' is not known: use local or central") from None
    prov = provider_service.get(session, provider)
    if prov.state != ProviderState.ENABLED:
        raise Conflict(f"provider '{prov.kind}' is {prov.state}, not enabled: wait for it or see `provision provider show {prov.kind}`")
    settings = provider_for(prov.kind).validate_region(
        name, {**(options or {}), "storage_mode": mode.value, "public_jobs": public_jobs})
    if session.scalar(select(Region.id).where(Region.provider_id == prov.id, Region.name == name,
                                              Region.state != RegionState.REMOVED)):
        raise Conflict(f"region '{name}' already exists for provider '{prov.kind}': choose another name",
                       code="duplicate_name")
    region = Region(id=new_id("reg"), name=name, provider=prov, storage_mode=mode.value, public_jobs=public_jobs, settings=settings)
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
    stmt = select(Region).where((Region.name == ref) | (Region.id == ref), Region.state != RegionState.REMOVED)
    if provider:
        stmt = stmt.join(Provider).where((Provider.kind == provider) | (Provider.id == provider))
    return names.one_named(list(session.scalars(stmt)), kind=KIND, ref=ref, place=lambda r: r.provider.kind,
                           scope="providers", option="--provider")


def live_nodes(session: Session, region: Region) -> list[Node]:
    return list(session.scalars(select(Node).where(Node.region_id == region.id, Node.state != NodeState.REMOVED)
                                .order_by(Node.name)))


def _shown(names: list[str]) -> str:
    return ", ".join(names[:5]) + (" …" if len(names) > 5 else "")


def remove(session: Session, ref: str, *, force: bool = False, provider: str | None = None, actor: str) -> Region:
    """Refused while the region holds nodes, reservations or datastores; with `force` they are all
    removed with it, in the caller's one transaction, each with its own history line."""
    from provisioner.services import datastores as datastore_service  # these import regions
    from provisioner.services import nodes as node_service
    from provisioner.services import reservations as reservation_service

    region = get(session, ref, provider)
    # what the provider made for the region (the GCP storage node's VM, whose node row carries the
    # VM's name) goes with it, deleted by the provider's reconciler; other nodes need --force
    made = {a.name for a in provider_for(region.provider.kind).plan_region(region.name, region.settings or {})
            if a.kind == "instance"}
    nodes = [n for n in live_nodes(session, region) if n.name not in made]
    rsvs = reservation_service.list_all(session, region.id)
    stores = datastore_service.list_all(session, region.id)
    held = [(len(rows), what, _shown([r.name for r in rows]))
            for rows, what in ((nodes, "node"), (rsvs, "reservation"), (stores, "datastore")) if rows]
    if held and not force:
        listed = "; ".join(f"{n} {what}(s) ({names})" for n, what, names in held)
        raise Conflict(f"region '{region.name}' still has {listed}: remove them first, or pass --force to "
                       f"remove them together with the region", code="region_in_use")
    if RegionState(region.state) != RegionState.REMOVING:
        transition(session, region, RegionState.REMOVING, actor=actor, reason="removal requested by operator")
    why = f"region '{region.name}' removed with --force"
    for rsv in rsvs:  # before the nodes, so each reservation's history says why it went
        reservation_service.remove_row(session, rsv, actor=actor, reason=why)
    for ds in stores:
        datastore_service.remove_row(session, ds, actor=actor, reason=why)
    for node in nodes:
        node_service.transition(session, node, NodeState.REMOVED, actor=actor, reason=why)
    if made:
        # its reconciler deletes what it made, then → removed (woken once this removal is committed)
        event.listen(session, "after_commit", lambda _s: kick(f"{region.provider.kind}-regions"), once=True)
        return region
    # physical regions own nothing outside the store, so removal completes at once
    transition(session, region, RegionState.REMOVED, actor=actor)
    return region
