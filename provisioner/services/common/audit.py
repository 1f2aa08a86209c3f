"""The audit trail: every state transition of every resource, with who, when, from, to and why."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from provisioner.domain.text import printable
from provisioner.store.models import AuditEvent

# A reason is one line: the refusal's sentence, its (already bounded) quote of the client's input and
# structured detail. Longer than this is cut, so no request can store more than a few KiB of audit text.
REASON_MAX = 2000


def record(
    session: Session,
    *,
    kind: str,
    resource_id: str,
    name: str,
    actor: str,
    from_state: str | None,
    to_state: str,
    reason: str | None = None,
) -> AuditEvent:
    event = AuditEvent(
        resource_kind=kind,
        resource_id=resource_id,
        resource_name=name,
        actor=actor,
        from_state=from_state,
        to_state=to_state,
        reason=None if reason is None else printable(reason, REASON_MAX),
    )
    session.add(event)
    return event


def note(
    session: Session, *, kind: str, resource_id: str, name: str, actor: str, state: str, reason: str
) -> AuditEvent:
    """A line in a resource's history that changes nothing: a playbook task, a setting, a refusal that
    leaves the node where it is. From and to are both its current state."""
    return record(
        session,
        kind=kind,
        resource_id=resource_id,
        name=name,
        actor=actor,
        from_state=state,
        to_state=state,
        reason=reason,
    )


def history(session: Session, kind: str, resource_ids: list[str]) -> list[AuditEvent]:
    """Events of one or more resources (a node and the nodes it replaced), oldest first."""
    stmt = (
        select(AuditEvent)
        .where(AuditEvent.resource_kind == kind, AuditEvent.resource_id.in_(resource_ids))
        .order_by(AuditEvent.id)
    )
    return list(session.scalars(stmt))
