"""/v1/operator-tokens: create, list, rotate, revoke operator bearer tokens (services/accounts/tokens.py). A
token's
secret appears in exactly two answers: the one that created it and the one that rotated it.

Admin tokens only (docs/accounts.md): an admin manages its own account's tokens; the root account's admins
manage every account's, and only they may name another account. Another account's token answers 404."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter
from pydantic import BaseModel, Field

from provisioner.api.deps import Db, Principal
from provisioner.api.errors import documented
from provisioner.api.schemas import Page
from provisioner.domain.roles import Action, Role
from provisioner.domain.roles import Principal as PrincipalValue
from provisioner.domain.states import OperatorTokenState
from provisioner.services.accounts import accounts
from provisioner.services.accounts import tokens as service
from provisioner.store.models import ApiToken

router = APIRouter(prefix="/v1/operator-tokens", tags=["operator tokens"], responses=documented(403))
Ttl = Annotated[str | None, Field(None, max_length=16, description="30m, 24h, 7d, 2w or 'never' (default)")]


class OperatorTokenIn(BaseModel):
    name: str = Field(max_length=63)
    ttl: Ttl = None
    account: str | None = Field(
        None, max_length=63, description="the account (name or id) it belongs to; default: the caller's"
    )
    role: Role = Field(Role.ADMIN, description="admin (manages the account's tokens) or member")


class RotateIn(BaseModel):
    ttl: Ttl = None


class OperatorTokenOut(BaseModel):
    id: str
    name: str
    role: str
    account_id: str
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
            account_id=row.account_id,
            state=service.state_of(row),
            created_at=row.created_at,
            expires_at=row.expires_at,
            last_used_at=row.last_used_at,
            revoked_at=row.revoked_at,
            token=token,
        )


def _scope(principal: PrincipalValue) -> str | None:
    """The account whose tokens the caller manages (None: all), once it is known to be an admin."""
    principal.require(Action.MANAGE_TOKENS)
    return principal.account_scope()


@router.post("", status_code=201)
def create(body: OperatorTokenIn, session: Db, principal: Principal) -> OperatorTokenOut:
    account = accounts.token_account(session, principal, body.account)
    row, token = service.create(
        session, body.name, ttl=body.ttl, actor=principal.actor, account_id=account.id, role=body.role.value
    )
    return OperatorTokenOut.of(row, token)


@router.get("")
def list_tokens(session: Db, principal: Principal) -> Page[OperatorTokenOut]:
    return Page(items=[OperatorTokenOut.of(r) for r in service.list_all(session, _scope(principal))])


@router.get("/{ref}")
def show(ref: str, session: Db, principal: Principal) -> OperatorTokenOut:
    return OperatorTokenOut.of(service.get(session, ref, _scope(principal)))


@router.post("/{ref}/rotate")
def rotate(ref: str, body: RotateIn, session: Db, principal: Principal) -> OperatorTokenOut:
    row, token = service.rotate(session, ref, ttl=body.ttl, actor=principal.actor, scope=_scope(principal))
    return OperatorTokenOut.of(row, token)


@router.delete("/{ref}")
def revoke(ref: str, session: Db, principal: Principal) -> OperatorTokenOut:
    row = service.revoke(
        session, ref, actor=principal.actor, current=principal.actor, scope=_scope(principal)
    )
    return OperatorTokenOut.of(row)
