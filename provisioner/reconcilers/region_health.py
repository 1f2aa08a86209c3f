"""Reconciler: a region's health follows its nodes' heartbeats. new/offline → healthy as soon as one of
its nodes (its storage node included) heartbeated within the online window; healthy → offline when none
did. A new region nobody ever reported from stays new. The same pass forgets expired join attempts and
nonces."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from provisioner.domain.states import ONLINE_WINDOW, NodeState, RegionState
from provisioner.providers.base import provider_for
from provisioner.reconcilers.loop import register
from provisioner.services import join as join_service
from provisioner.services import regions as region_service
from provisioner.services.wakeups import Wake
from provisioner.store.engine import session_scope
from provisioner.store.models import Node, Region

ACTOR = "reconciler:region-health"


def refresh(session: Session, now: datetime | None = None) -> None:
    now = now or datetime.now(UTC)
    cutoff = now - ONLINE_WINDOW
    regions = list(
        session.scalars(
            select(Region).where(
                Region.state.in_([RegionState.NEW, RegionState.HEALTHY, RegionState.OFFLINE])
            )
        )
    )
    for region in regions:
        if provider_for(region.provider.kind).owns_region_health:
            continue  # e.g. GCP: reconcilers/gcp.py's health step (storage node + VM events) decides
        online = session.scalar(
            select(func.count())
            .select_from(Node)
            .where(
                Node.region_id == region.id, Node.state != NodeState.REMOVED, Node.last_heartbeat_at >= cutoff
            )
        )
        if online and region.state != RegionState.HEALTHY:
            region_service.transition(
                session, region, RegionState.HEALTHY, actor=ACTOR, reason=f"{online} node(s) reporting"
            )
        elif not online and region.state == RegionState.HEALTHY:
            region_service.transition(
                session,
                region,
                RegionState.OFFLINE,
                actor=ACTOR,
                reason=f"no node reported in the last {ONLINE_WINDOW.total_seconds():.0f} s",
            )
    join_service.purge_stale(session)


@register(Wake.REGION_HEALTH, period_s=15.0)
def reconcile(sessions: sessionmaker[Session]) -> None:
    with session_scope(sessions) as session:
        refresh(session)
