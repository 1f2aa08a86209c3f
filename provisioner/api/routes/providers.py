"""/v1/providers: enable, list, show, remove."""

from __future__ import annotations

from fastapi import APIRouter

from provisioner.api.deps import Db, Operator, TrustRoot
from provisioner.api.schemas import Page, ProviderIn, ProviderOut
from provisioner.services.regions import providers as service

router = APIRouter(prefix="/v1/providers", tags=["providers"])


@router.post("", status_code=201, dependencies=[TrustRoot])
def enable(body: ProviderIn, session: Db, actor: Operator) -> ProviderOut:
    raw = {**body.config, **({"payment_mode": body.payment_mode} if body.payment_mode else {})}
    return ProviderOut.of(service.enable(session, body.kind, raw, actor=actor))


@router.get("")
def list_providers(session: Db) -> Page[ProviderOut]:
    return Page(items=[ProviderOut.of(p) for p in service.list_all(session)])


@router.get("/{ref}")
def show(ref: str, session: Db) -> ProviderOut:
    return ProviderOut.of(service.get(session, ref))


@router.delete("/{ref}", dependencies=[TrustRoot])
def remove(ref: str, session: Db, actor: Operator) -> ProviderOut:
    return ProviderOut.of(service.remove(session, ref, actor=actor))
