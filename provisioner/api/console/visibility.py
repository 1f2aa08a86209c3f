"""What a console user may see: the regions of their own account (every region for the root account's
admins, who run the fleet), and what lives in those regions (nodes, datastores, reservations, pending
minions, join refusals). Another account's region, or anything in it, answers the same NotFound as a
missing one, with the API's wording (docs/accounts.md: "Other accounts look missing, not forbidden").

The console's actions, like the API's fleet routes, also run scoped (api/deps.enter_fleet,
store/row_scope.py); its pages read through these functions."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from contracts.errors import NotFound
from provisioner.domain.roles import Principal
from provisioner.services.data import datastores
from provisioner.services.fleet import nodes, pending
from provisioner.services.regions import regions, reservations
from provisioner.store.models import Node, Region
from provisioner.store.regional_models import Datastore, Reservation


def _missing(kind: str, ref: str) -> NotFound:
    # the words of services/names.one_named, so a hidden row reads exactly like a missing one
    return NotFound(f"{kind} '{ref}' does not exist: see `provision {kind} list`", code=f"{kind}_not_found")


def sees(principal: Principal, region: Region) -> bool:
    scope = principal.account_scope()
    return scope is None or region.account_id == scope


def visible_regions(session: Session, principal: Principal) -> list[Region]:
    return [r for r in regions.list_all(session) if sees(principal, r)]


def region(session: Session, principal: Principal, ref: str) -> Region:
    found = regions.get(session, ref)
    if not sees(principal, found):
        raise _missing("region", ref)
    return found


def node(session: Session, principal: Principal, ref: str, *, include_removed: bool = False) -> Node:
    found = nodes.get(session, ref, include_removed=include_removed)
    if not sees(principal, found.region):
        raise _missing("node", ref)
    return found


def datastore(session: Session, principal: Principal, ref: str) -> Datastore:
    found = datastores.get(session, ref)
    if not sees(principal, found.region):
        raise _missing("datastore", ref)
    return found


def reservation(session: Session, principal: Principal, ref: str) -> Reservation:
    found = reservations.get(session, ref)
    if not sees(principal, found.region):
        raise _missing("reservation", ref)
    return found


def pending_minions(session: Session, principal: Principal) -> list[dict[str, Any]]:
    """services/pending.pending rows of the visible regions, each with its region's id added."""
    by_name: dict[str, list[Region]] = {}
    for r in visible_regions(session, principal):
        by_name.setdefault(r.name, []).append(r)
    out = []
    for row in pending.pending(session):
        candidates = by_name.get(row["region"], [])
        if candidates:
            out.append({**row, "region_id": candidates[0].id})
    return out


def refusals(session: Session, principal: Principal, limit: int = 200) -> list[dict[str, Any]]:
    """Join refusals (services/pending.refusals). A refusal names a minion_id only, so an account's
    admins and members see those of minions pending in, or held by a node of, their regions."""
    rows = pending.refusals(session, limit=limit)
    if principal.account_scope() is None:
        return rows
    region_ids = [r.id for r in visible_regions(session, principal)]
    mine = set(session.scalars(select(Node.minion_id).where(Node.region_id.in_(region_ids))))
    mine |= {p["minion_id"] for p in pending_minions(session, principal)}
    return [r for r in rows if r["minion_id"] in mine]
