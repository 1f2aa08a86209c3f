"""Rejected minions (salt-key's `reject`): an operator refuses a minion_id — the SHA-256 of its TPM's EK,
so one machine — for good: every join from it is refused with `join_minion_rejected` and audited, and it
no longer shows as pending, until `unreject`. The join service asks `refusal_for` first
(provisioner/services/fleet/join.py)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from contracts.errors import Conflict, NotFound
from provisioner.attestation.refusals import Refusal, RefusalCode, refuse
from provisioner.domain.states import MINION_REJECTION_TRANSITIONS, MinionRejection
from provisioner.services.common import lifecycle, names
from provisioner.services.fleet import nodes as node_service
from provisioner.store.join_models import PendingMinion, RejectedMinion

KIND = "minion"  # audit kind: the history of a minion_id's rejections


def reject(session: Session, minion_id: str, *, reason: str | None, actor: str) -> RejectedMinion:
    """Refuse the minion's joins from now on; it leaves the pending list. Refused while a live node holds
    the minion_id (remove that node first: a rejection is for machines no node should be)."""
    names.minion_id(minion_id)
    holder = node_service.by_minion_id(session, minion_id)
    if holder is not None:
        raise Conflict(
            f"minion_id {minion_id} is held by node '{holder.name}': remove it first with "
            f"`provision node remove {holder.name}`, then reject the minion",
            code="minion_has_node",
        )
    row = session.get(RejectedMinion, minion_id)
    if row is not None:
        return row  # already rejected: nothing changes
    row = RejectedMinion(minion_id=minion_id, reason=reason, created_by=actor)
    session.add(row)
    pending = session.get(PendingMinion, minion_id)
    if pending is not None:
        session.delete(pending)
    _record(session, minion_id, actor, None, MinionRejection.REJECTED, reason or "rejected by operator")
    return row


def unreject(session: Session, minion_id: str, *, actor: str) -> str:
    """Let the minion join again (it shows as pending at its next attempt)."""
    names.minion_id(minion_id)
    row = session.get(RejectedMinion, minion_id)
    if row is None:
        raise NotFound(
            f"minion {minion_id} is not rejected: see `provision node rejected`", code="minion_not_rejected"
        )
    session.delete(row)
    _record(
        session, minion_id, actor, MinionRejection.REJECTED, MinionRejection.LIFTED, "unrejected by operator"
    )
    return minion_id


def _record(
    session: Session,
    minion_id: str,
    actor: str,
    frm: MinionRejection | None,
    to: MinionRejection,
    reason: str,
) -> None:
    """Audit one step of the minion_id's rejection history (checked against MINION_REJECTION_TRANSITIONS)
    and flush, so the row change and its audit line land together."""
    lifecycle.record(
        session,
        kind=KIND,
        resource_id=minion_id,
        name=minion_id,
        actor=actor,
        table=MINION_REJECTION_TRANSITIONS,
        frm=frm,
        to=to,
        reason=reason,
    )
    session.flush()


def list_all(session: Session) -> list[RejectedMinion]:
    return list(session.scalars(select(RejectedMinion).order_by(RejectedMinion.created_at)))


def refusal_for(session: Session, minion_id: str) -> Refusal | None:
    """The refusal a join from this minion gets, or None when it is not rejected."""
    row = session.get(RejectedMinion, minion_id)
    if row is None:
        return None
    when = row.created_at.isoformat() if row.created_at else "earlier"
    return refuse(
        RefusalCode.minion_rejected, f"by {row.created_by} at {when}: {row.reason or 'no reason given'}"
    )
