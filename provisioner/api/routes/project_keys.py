"""/v1/projects/{ref}/keys: a project's third-party keys (services/accounts/project_keys.py). The secret
half goes in and never comes out: every answer has the key's kind, registry and username only. Another
account's project, shared or not, answers 404 like a missing one."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, Response
from pydantic import BaseModel, ConfigDict, Field

from provisioner.api import convertors  # noqa: F401  (registers {ref:anypath})
from provisioner.api.deps import Db, Principal
from provisioner.api.errors import documented
from provisioner.api.schemas import Page
from provisioner.domain.key_kinds import DEFAULT_NAME, KeyKind
from provisioner.services.accounts import project_keys as service
from provisioner.store.account_models import ProjectKey

router = APIRouter(prefix="/v1/projects", tags=["projects"], responses=documented(403))


class KeyIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: str = Field(KeyKind.REGISTRY.value, max_length=16, description="what the key opens")
    registry: str | None = Field(
        None, max_length=253, description="a registry key's host[:port], e.g. ghcr.io"
    )
    name: str | None = Field(None, max_length=63, description="another kind's label (default: `default`)")
    username: str = Field(max_length=256, description="the public half: a username, an access key id")
    secret: str = Field(max_length=service.SECRET_MAX, description="a password or token; never returned")


class KeyOut(BaseModel):
    id: str
    kind: str
    registry: str = Field(description="a registry key's host; another kind's label (as `name`)")
    name: str
    username: str
    created_by: str
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, row: ProjectKey) -> KeyOut:
        return cls(
            id=row.id,
            kind=row.kind,
            registry=row.name,
            name=row.name,
            username=row.key_id,
            created_by=row.created_by,
            created_at=row.created_at,
            updated_at=row.updated_at,
        )


@router.get("/{ref:anypath}/keys")
def list_keys(ref: str, session: Db, principal: Principal) -> Page[KeyOut]:
    return Page(items=[KeyOut.of(k) for k in service.list_keys(session, principal, ref)])


@router.put("/{ref:anypath}/keys", responses={201: {"model": KeyOut, "description": "a new key"}})
def set_key(ref: str, body: KeyIn, response: Response, session: Db, principal: Principal) -> KeyOut:
    """Add a key, or replace the project's key of that kind for that registry (200)."""
    row, created = service.set_key(
        session,
        principal,
        ref,
        kind=body.kind,
        name=body.registry or body.name or DEFAULT_NAME,
        key_id=body.username,
        secret=body.secret,
    )
    if created:
        response.status_code = 201
    return KeyOut.of(row)


@router.delete("/{ref:anypath}/keys/{kind}/{registry}")
def remove_key(ref: str, kind: str, registry: str, session: Db, principal: Principal) -> KeyOut:
    return KeyOut.of(service.remove_key(session, principal, ref, kind=kind, name=registry))
