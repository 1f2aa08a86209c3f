"""Finding regional resources (reservations, datastores): live rows by id or by name, where a name is
unique per region and `region` disambiguates a name used in several regions."""

from __future__ import annotations

from typing import Any, TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session

from provisioner.errors import InvalidInput, NotFound
from provisioner.services import regions as region_service

M = TypeVar("M")
REMOVED = "removed"


def _live(session: Session, model: type[M], region: str | None) -> Any:
    stmt = select(model).where(model.state != REMOVED)  # type: ignore[attr-defined]
    if region:
        stmt = stmt.where(model.region_id == region_service.get(session, region).id)  # type: ignore[attr-defined]
    return stmt


def list_live(session: Session, model: type[M], region: str | None = None) -> list[M]:
    return list(session.scalars(_live(session, model, region).order_by(model.name)))  # type: ignore[attr-defined]


def get_live(session: Session, model: type[M], kind: str, ref: str, region: str | None = None) -> M:
    found = list(session.scalars(_live(session, model, region).where(
        (model.name == ref) | (model.id == ref))))  # type: ignore[attr-defined]
    if not found:
        raise NotFound(f"{kind} '{ref}' does not exist: see `provision {kind} list`", code=f"{kind}_not_found")
    if len(found) > 1:
        where = ", ".join(sorted(row.region.name for row in found))  # type: ignore[attr-defined]
        raise InvalidInput(f"{kind} name '{ref}' exists in several regions ({where}): pass --region")
    return found[0]
