"""The one routine behind every state change of every resource: check the table, set the state (and
the reason, kept only for the states in `KEEPS_REASON`), write the audit line, flush so a lost race
surfaces here. Resources call it from their `transition()`; nothing else assigns a state column."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from sqlalchemy.orm import Session

from provisioner.domain.states import KEEPS_REASON, check
from provisioner.services.common import audit
from provisioner.services.common.errors import flush


def apply(
    session: Session,
    row: Any,
    to: StrEnum,
    *,
    kind: str,
    name: str,
    table: Mapping[Any, frozenset[Any]],
    actor: str,
    reason: str | None,
    column: str = "state",
    resource_id: str | None = None,
) -> None:
    """`row` has `id` (or pass `resource_id`) and the `column` holding its state; `table` is its
    transition table. A row with a `reason` column keeps `reason` only for the states that explain
    themselves (errored, offline)."""
    value = getattr(row, column)
    current = type(to)(value) if value else None
    if current is not None:
        check(kind, name, table, current, to)
    setattr(row, column, to.value)
    if hasattr(row, "reason"):
        row.reason = reason if to in KEEPS_REASON else None
    audit.record(
        session,
        kind=kind,
        resource_id=resource_id or row.id,
        name=name,
        actor=actor,
        from_state=current.value if current else None,
        to_state=to.value,
        reason=reason,
    )
    flush(session, f"{kind} '{name}'")


def record(
    session: Session,
    *,
    kind: str,
    resource_id: str,
    name: str,
    actor: str,
    table: Mapping[Any, frozenset[Any]],
    frm: StrEnum | None,
    to: StrEnum,
    reason: str | None,
) -> None:
    """The audited path of resources whose state is not a column (trusted keys and CAs, whose rows are
    deleted; join tokens, stamped `revoked_at`): check the table, write the audit line."""
    if frm is not None:
        check(kind, name, table, frm, to)
    audit.record(
        session,
        kind=kind,
        resource_id=resource_id,
        name=name,
        actor=actor,
        from_state=frm.value if frm else None,
        to_state=to.value,
        reason=reason,
    )
