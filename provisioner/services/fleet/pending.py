"""What the operator sees of joins that no node claims yet: pending minions (reached the control plane,
no live node has their minion_id) and the join refusals of the audit trail."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from provisioner.domain import hardware_text
from provisioner.domain.states import JoinOutcome
from provisioner.services.fleet import nodes as node_service
from provisioner.services.regions import regions as region_service
from provisioner.store import row_scope
from provisioner.store.join_models import PendingMinion
from provisioner.store.models import AuditEvent, Region


def pending(session: Session, region: str | None = None) -> list[dict[str, Any]]:
    """Minions that reached the control plane and no live node claims (oldest first)."""
    stmt = (
        select(PendingMinion, Region.name)
        .join(Region, Region.id == PendingMinion.region_id)
        .order_by(PendingMinion.first_seen)
    )
    if region:
        stmt = stmt.where(PendingMinion.region_id == region_service.get(session, region).id)
    out = []
    for row, region_name in session.execute(stmt):
        if node_service.by_minion_id(session, row.minion_id) is not None:
            continue
        out.append(
            {
                "minion_id": row.minion_id,
                "region": region_name,
                "region_id": row.region_id,
                "first_seen": row.first_seen,
                "last_seen": row.last_seen,
                "attested": row.attested,
                "identity": row.identity,
                "inventory": hardware_text.one_line(row.inventory or {}),
                "requirements": hardware_text.requirements_line(row.requirements or {}),
                "refusal": row.refusal,
                "state": JoinOutcome.PENDING.value,
            }
        )
    return out


def refusals(session: Session, *, minion_id: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
    stmt = (
        select(AuditEvent)
        .where(AuditEvent.resource_kind == "join")
        .order_by(AuditEvent.id.desc())
        .limit(limit)
    )
    if minion_id:
        stmt = stmt.where(AuditEvent.resource_id == minion_id)
    if (seen := row_scope.seen_minion_ids(session)) is not None:
        stmt = stmt.where(AuditEvent.resource_id.in_(seen))
    return [
        {
            "id": e.id,
            "at": e.at,
            "minion_id": e.resource_id,
            "name": e.resource_name,
            "actor": e.actor,
            "reason": e.reason,
            "state": e.to_state,
        }
        for e in session.scalars(stmt)
    ]
