"""The one routine behind every resource's `transition()`: check the table, set the state (and the
reason, kept for `errored` and `offline`), write the audit line, flush so a lost race surfaces here."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from sqlalchemy.orm import Session

from provisioner.services import audit
from provisioner.services.errors import flush
from provisioner.states import check


def apply(session: Session, row: Any, to: StrEnum, *, kind: str, name: str,
          table: Mapping[Any, frozenset[Any]], actor: str, reason: str | None) -> None:
    """`row` has `id`, `state` and `reason` columns; `table` is its transition table."""
    current = type(to)(row.state) if row.state else None
    if current is not None:
        check(kind, name, table, current, to)
    row.state = to.value
    # errored says why it failed; offline says why it went away (e.g. a GCP storage node was preempted)
    row.reason = reason if to.value in ("errored", "offline") else None
    audit.record(session, kind=kind, resource_id=row.id, name=name, actor=actor,
                 from_state=current.value if current else None, to_state=to.value, reason=reason)
    flush(session, f"{kind} '{name}'")
