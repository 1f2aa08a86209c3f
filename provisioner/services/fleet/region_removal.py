"""Removing a region: refused while it holds nodes, reservations or datastores unless forced, in which
case they are removed first, in the caller's one transaction, each with its own history line.

It sits above regions, nodes, reservations and datastores (all of which look regions up), so none of
them needs to import the others to remove a region."""

from __future__ import annotations

from sqlalchemy.orm import Session

from contracts.errors import Conflict
from provisioner.domain.states import NodeState, RegionState
from provisioner.providers.base import Feature, provider_for
from provisioner.services.common.wakeups import FEATURE_WORK, wake_after_commit
from provisioner.services.data import datastores as datastore_service
from provisioner.services.fleet import nodes as node_service
from provisioner.services.regions import regions as region_service
from provisioner.services.regions import reservations as reservation_service
from provisioner.store.models import Region

SHOWN = 5  # names listed in the refusal before "…"


def _shown(names: list[str]) -> str:
    return ", ".join(names[:SHOWN]) + (" …" if len(names) > SHOWN else "")


def remove(
    session: Session,
    ref: str,
    *,
    force: bool = False,
    provider: str | None = None,
    actor: str,
    dry_run: bool = False,
) -> Region:
    """Refused while the region holds nodes, reservations or datastores; with `force` they are all
    removed with it, in the caller's one transaction, each with its own history line. `dry_run`: the
    same refusal, or the region as it is (nothing changes), so the CLI refuses before it asks."""
    region = region_service.get(session, ref, provider)
    # what the provider made for the region (the GCP storage node's VM, whose node row carries the
    # VM's name) goes with it, deleted by the provider's reconciler; other nodes need --force
    made = {
        a.name
        for a in provider_for(region.provider.kind).plan_region(region.name, region.settings or {})
        if a.kind == "instance"
    }
    nodes = [n for n in region_service.live_nodes(session, region) if n.name not in made]
    rsvs = reservation_service.list_all(session, region.id)
    stores = datastore_service.list_all(session, region.id)
    held = [
        (len(rows), what, _shown([r.name for r in rows]))
        for rows, what in ((nodes, "node"), (rsvs, "reservation"), (stores, "datastore"))
        if rows
    ]
    if held and not force:
        listed = "; ".join(f"{n} {what}(s) ({names})" for n, what, names in held)
        raise Conflict(
            f"region '{region.name}' still has {listed}: remove them first, or pass --force to "
            f"remove them together with the region",
            code="region_in_use",
        )
    if dry_run:
        return region
    if RegionState(region.state) != RegionState.REMOVING:
        region_service.transition(
            session, region, RegionState.REMOVING, actor=actor, reason="removal requested by operator"
        )
    why = f"region '{region.name}' removed with --force"
    for rsv in rsvs:  # before the nodes, so each reservation's history says why it went
        reservation_service.remove_row(session, rsv, actor=actor, reason=why)
    for ds in stores:
        datastore_service.remove_row(session, ds, actor=actor, reason=why)
    for node in nodes:
        node_service.transition(session, node, NodeState.REMOVED, actor=actor, reason=why)
    if made:
        # its reconciler deletes what it made, then → removed (woken once this removal is committed)
        wake_after_commit(session, FEATURE_WORK[Feature.REGION_NODE])
        return region
    # physical regions own nothing outside the store, so removal completes at once
    region_service.transition(session, region, RegionState.REMOVED, actor=actor)
    return region
