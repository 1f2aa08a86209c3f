"""Finding regional resources (reservations, datastores; nodes use `holder`): live rows by id or by
name, where a name is unique per region and `region` disambiguates a name used in several regions."""

from __future__ import annotations

from typing import Any, TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session

from provisioner.domain.states import TERMINAL
from provisioner.services.common import names
from provisioner.services.regions import regions as region_service

# The models looked up here (Node, Reservation, Datastore) share the columns used below (id, name, state,
# region_id) by convention, not through a type mypy can check against the class: a Protocol of `Mapped[...]`
# members does not match SQLAlchemy declarative classes, hence the targeted `attr-defined` ignores.
M = TypeVar("M")
LIVE_NOT = sorted(TERMINAL)  # a live row is in no final state (its name, hostname or port are taken)


def _live(session: Session, model: type[M], region: str | None) -> Any:
    stmt = select(model).where(model.state.not_in(LIVE_NOT))  # type: ignore[attr-defined]
    if region:
        stmt = stmt.where(model.region_id == region_service.get(session, region).id)  # type: ignore[attr-defined]
    return stmt


def list_live(session: Session, model: type[M], region: str | None = None) -> list[M]:
    return list(session.scalars(_live(session, model, region).order_by(model.name)))  # type: ignore[attr-defined]


def get_live(session: Session, model: type[M], kind: str, ref: str, region: str | None = None) -> M:
    found = list(
        session.scalars(_live(session, model, region).where((model.name == ref) | (model.id == ref)))  # type: ignore[attr-defined]
    )
    return names.one_named(
        found,
        kind=kind,
        ref=ref,
        place=lambda row: row.region.name,
        scope="regions",
        option="--region",
    )


def holder(session: Session, model: type[M], region_id: str, **where: Any) -> M | None:
    """The live row of `model` in the region whose columns equal `where` (who already holds a name,
    hostname or port that must be unique in the region), or None."""
    live = model.state.not_in(LIVE_NOT)  # type: ignore[attr-defined]
    stmt = select(model).where(model.region_id == region_id, live)  # type: ignore[attr-defined]
    for column, value in where.items():
        stmt = stmt.where(getattr(model, column) == value)
    return session.scalar(stmt)
