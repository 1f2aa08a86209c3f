"""/v1/regions: create, list, show, update (public jobs), remove (?force=true removes its nodes,
reservations and datastores too)."""

from __future__ import annotations

from fastapi import APIRouter

from contracts.errors import InvalidInput
from provisioner.api.deps import Db, Operator, Principal
from provisioner.api.schemas import Page, RegionIn, RegionOut, RegionSettingsIn
from provisioner.services.billing import ledger
from provisioner.services.fleet import region_removal
from provisioner.services.regions import regions as service

router = APIRouter(prefix="/v1/regions", tags=["regions"])


@router.post("", status_code=201)
def create(body: RegionIn, session: Db, principal: Principal) -> RegionOut:
    region = service.create(
        session,
        body.name,
        provider=body.provider,
        storage_mode=body.storage_mode,
        public_jobs=body.public_jobs,
        options=body.options,
        actor=principal.actor,
        account_id=principal.account_id,
    )
    return RegionOut.of(region)


@router.get("")
def list_regions(session: Db, provider: str | None = None) -> Page[RegionOut]:
    return Page(items=[RegionOut.of(r) for r in service.list_all(session, provider)])


@router.get("/{ref}")
def show(ref: str, session: Db, provider: str | None = None) -> RegionOut:
    region = service.get(session, ref, provider)
    return RegionOut.of(region).model_copy(
        update={"credits_earned": ledger.region_earnings(session, region.id)}
    )


@router.patch("/{ref}")
def update(ref: str, body: RegionSettingsIn, session: Db, principal: Principal) -> RegionOut:
    """Change what the body names; a field left out stays as it is."""
    if body.public_jobs is None and body.jobs_lan is None:
        raise InvalidInput(
            "nothing to change: name a setting, e.g. `provision region update R --public-jobs`"
        )
    if body.public_jobs is not None:
        region = service.set_public_jobs(session, ref, body.public_jobs, principal=principal)
    if body.jobs_lan is not None:
        region = service.set_jobs_lan(session, ref, body.jobs_lan, principal=principal)
    return RegionOut.of(region)


@router.delete("/{ref}")
def remove(
    ref: str,
    session: Db,
    actor: Operator,
    force: bool = False,
    provider: str | None = None,
    dry_run: bool = False,
) -> RegionOut:
    """`dry_run`: answer as the removal would (409 `region_in_use`, or the region), change nothing."""
    removed = region_removal.remove(
        session, ref, force=force, provider=provider, actor=actor, dry_run=dry_run
    )
    return RegionOut.of(removed)
