"""Reconciler: every region's health, by its provider's rule. The pass builds a RegionHealthView from the
store (nodes reporting within the online window; the storage node, its state and, for a cloud one, whether
its VM runs) and asks the region's provider driver `unhealthy_because(view)`: own hardware is healthy
while any node reports; a GCP region while its storage node's VM runs and the node is active and reports.
new/offline → healthy when nothing is wrong; healthy → offline with the reason otherwise; a new region
nobody ever reported from stays new. The same pass forgets expired join attempts and nonces."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from provisioner.domain.health import RegionHealthView, StorageNodeView
from provisioner.domain.states import ONLINE_WINDOW, NodeState, RegionState, Service
from provisioner.providers.base import provider_for
from provisioner.reconcilers.loop import register
from provisioner.services.common.wakeups import Wake
from provisioner.services.fleet import join as join_service
from provisioner.services.regions import regions as region_service
from provisioner.store.engine import session_scope
from provisioner.store.gcp_models import GcpStorageNode
from provisioner.store.models import Node, Region

ACTOR = "reconciler:region-health"


def view_of(session: Session, region: Region, cutoff: datetime) -> RegionHealthView:
    reporting = session.scalar(
        select(func.count())
        .select_from(Node)
        .where(Node.region_id == region.id, Node.state != NodeState.REMOVED, Node.last_heartbeat_at >= cutoff)
    )
    storage = session.scalar(
        select(Node).where(
            Node.region_id == region.id, Node.service == Service.STORAGE, Node.state != NodeState.REMOVED
        )
    )
    vm = session.get(GcpStorageNode, region.id)
    if vm is not None and storage is None:
        storage = session.get(Node, vm.node_id)
    return RegionHealthView(
        name=region.name,
        nodes_reporting=int(reporting or 0),
        storage_node=None
        if storage is None
        else StorageNodeView(
            name=storage.name,
            state=NodeState(storage.state),
            reporting=storage.last_heartbeat_at is not None and storage.last_heartbeat_at >= cutoff,
            vm_running=vm.running if vm is not None else None,
        ),
    )


def refresh_region(session: Session, region: Region, now: datetime | None = None) -> None:
    """Apply the region's provider's health rule to it now."""
    state = RegionState(region.state)
    if state not in (RegionState.NEW, RegionState.HEALTHY, RegionState.OFFLINE):
        return
    view = view_of(session, region, (now or datetime.now(UTC)) - ONLINE_WINDOW)
    driver = provider_for(region.provider.kind)
    why = driver.unhealthy_because(view)
    if why is None and state != RegionState.HEALTHY:
        region_service.transition(
            session, region, RegionState.HEALTHY, actor=ACTOR, reason=driver.healthy_because(view)
        )
    elif why is not None and state == RegionState.HEALTHY:
        region_service.transition(session, region, RegionState.OFFLINE, actor=ACTOR, reason=why)


def refresh(session: Session, now: datetime | None = None) -> None:
    regions = session.scalars(
        select(Region).where(Region.state.in_([RegionState.NEW, RegionState.HEALTHY, RegionState.OFFLINE]))
    )
    for region in list(regions):
        refresh_region(session, region, now)
    join_service.purge_stale(session)


@register(Wake.REGION_HEALTH, period_s=15.0)
def reconcile(sessions: sessionmaker[Session]) -> None:
    with session_scope(sessions) as session:
        refresh(session)
