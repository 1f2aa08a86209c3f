"""/v1/operator-tokens: create, list, rotate, revoke operator bearer tokens (services/tokens.py). A token's
secret appears in exactly two answers: the one that created it and the one that rotated it."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter
from pydantic import BaseModel, Field

from provisioner.api.deps import Db, Operator
from provisioner.api.schemas import Page
from provisioner.domain.states import OperatorTokenState
from provisioner.services import tokens as service
from provisioner.store.models import ApiToken

router = APIRouter(prefix="/v1/operator-tokens", tags=["operator tokens"])
Ttl = Annotated[str | None, Field(None, max_length=16, description="30m, 24h, 7d, 2w or 'never' (default)")]


class OperatorTokenIn(BaseModel):
    name: str = Field(max_length=63)
    ttl: Ttl = None


class RotateIn(BaseModel):
    ttl: Ttl = None


class OperatorTokenOut(BaseModel):
    id: str
    name: str
    role: str
    state: OperatorTokenState
    created_at: datetime
    expires_at: datetime | None
    last_used_at: datetime | None
    revoked_at: datetime | None
    token: str | None = Field(None, description="the secret: only in the answer that created or rotated it")

    @classmethod
    def of(cls, row: ApiToken, token: str | None = None) -> OperatorTokenOut:
        return cls(
            id=row.id,
            name=row.name,
            role=row.role,
            state=service.state_of(row),
            created_at=row.created_at,
            expires_at=row.expires_at,
            last_used_at=row.last_used_at,
            revoked_at=row.revoked_at,
            token=token,
        )


@router.post("", status_code=201)
def create(body: OperatorTokenIn, session: Db, actor: Operator) -> OperatorTokenOut:
    row, token = service.create(session, body.name, ttl=body.ttl, actor=actor)
    return OperatorTokenOut.of(row, token)


@router.get("")
def list_tokens(session: Db) -> Page[OperatorTokenOut]:
    return Page(items=[OperatorTokenOut.of(r) for r in service.list_all(session)])


@router.get("/{ref}")
def show(ref: str, session: Db) -> OperatorTokenOut:
    return OperatorTokenOut.of(service.get(session, ref))


@router.post("/{ref}/rotate")
def rotate(ref: str, body: RotateIn, session: Db, actor: Operator) -> OperatorTokenOut:
    row, token = service.rotate(session, ref, ttl=body.ttl, actor=actor)
    return OperatorTokenOut.of(row, token)


@router.delete("/{ref}")
def revoke(ref: str, session: Db, actor: Operator) -> OperatorTokenOut:
    return OperatorTokenOut.of(service.revoke(session, ref, actor=actor, current=actor))
