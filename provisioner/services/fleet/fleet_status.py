"""The fleet at a glance (`provision status`): per region, its nodes by state, how many are offline,
pending minions, join tokens about to expire; fleet-wide, the join refusals of the last day. A handful of
grouped queries, so it stays one round trip for a fleet of any size."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from provisioner.domain.states import NODE_READY, ONLINE_WINDOW, JoinOutcome, NodeState, RegionState
from provisioner.services.fleet.pending import pending
from provisioner.store import row_scope
from provisioner.store.join_models import JoinToken
from provisioner.store.models import AuditEvent, Node, Provider, Region

EXPIRING_WITHIN = timedelta(days=1)  # join tokens that stop enrolling nodes within this are flagged
REFUSALS_SINCE = timedelta(days=1)


def status(session: Session, now: datetime | None = None) -> dict[str, Any]:
    now = now or datetime.now(UTC)
    cutoff = now - ONLINE_WINDOW
    regions = list(
        session.execute(
            select(Region.id, Region.name, Region.state, Provider.kind)
            .join(Provider, Provider.id == Region.provider_id)
            .where(Region.state != RegionState.REMOVED)
            .order_by(Region.name)
        )
    )
    by_state: dict[str, Counter[str]] = {r.id: Counter() for r in regions}
    offline: Counter[str] = Counter()
    # grouped by the label, not by the expression again: PostgreSQL takes a second copy of the expression,
    # with its own bound cutoff, for another one and refuses the query
    online = (Node.last_heartbeat_at >= cutoff).label("online")
    for region_id, state, heartbeat, count in session.execute(
        select(Node.region_id, Node.state, online, func.count())
        .where(Node.state != NodeState.REMOVED)
        .group_by(Node.region_id, Node.state, online)
    ):
        by_state.setdefault(region_id, Counter())[state] += count
        if state in NODE_READY and not heartbeat:
            offline[region_id] += count
    waiting = Counter(p["region"] for p in pending(session))
    tokens: dict[str, tuple[int, int]] = {}
    for region_id, expires_at in session.execute(
        select(JoinToken.region_id, JoinToken.expires_at).where(
            JoinToken.revoked_at.is_(None), (JoinToken.expires_at.is_(None)) | (JoinToken.expires_at > now)
        )
    ):
        live, soon = tokens.get(region_id, (0, 0))
        expiring = expires_at is not None and expires_at - now < EXPIRING_WITHIN
        tokens[region_id] = (live + 1, soon + int(expiring))
    refused_stmt = (
        select(func.count())
        .select_from(AuditEvent)
        .where(
            AuditEvent.resource_kind == "join",
            AuditEvent.to_state == JoinOutcome.REFUSED.value,
            AuditEvent.at >= now - REFUSALS_SINCE,
        )
    )
    if (seen := row_scope.seen_minion_ids(session)) is not None:
        refused_stmt = refused_stmt.where(AuditEvent.resource_id.in_(seen))
    refused = session.scalar(refused_stmt)
    rows = []
    for r in regions:
        nodes = by_state.get(r.id, Counter())
        live, soon = tokens.get(r.id, (0, 0))
        rows.append(
            {
                "region": r.name,
                "provider": r.kind,
                "state": r.state,
                "nodes": sum(nodes.values()),
                "by_state": dict(sorted(nodes.items())),
                "nodes_active": nodes.get(NodeState.ACTIVE.value, 0),
                "nodes_offline": offline.get(r.id, 0),
                "nodes_errored": nodes.get(NodeState.ERRORED.value, 0),
                "minions_pending": waiting.get(r.name, 0),
                "join_tokens": live,
                "join_tokens_expiring": soon,
            }
        )
    return {"at": now, "regions": rows, "refusals_24h": int(refused or 0)}
