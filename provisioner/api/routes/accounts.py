"""/v1/accounts: create and list accounts (services/accounts/accounts.py). The root account's admins create
accounts and see them all; every other token sees only its own account (another one answers 404)."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter
from pydantic import BaseModel, Field

from provisioner.api.deps import Db, Principal
from provisioner.api.errors import documented
from provisioner.api.schemas import Page
from provisioner.services.accounts import accounts as service
from provisioner.services.accounts import projects
from provisioner.store.account_models import Account

router = APIRouter(prefix="/v1/accounts", tags=["accounts"], responses=documented(403))


class AccountIn(BaseModel):
    name: str = Field(max_length=63, description="a DNS label: lowercase letters, digits and '-'")


class AccountOut(BaseModel):
    id: str
    name: str
    root: bool = Field(description="the account created at first start: its admins administer every account")
    default_project: str | None = Field(description="the id of the project jobs go to when none is named")
    created_at: datetime

    @classmethod
    def of(cls, row: Account, default_project: str | None) -> AccountOut:
        return cls(
            id=row.id,
            name=row.name,
            root=row.root,
            default_project=default_project,
            created_at=row.created_at,
        )


def _out(session: Db, row: Account) -> AccountOut:
    default = next((p.id for p in projects.list_all(session, row.id) if p.default), None)
    return AccountOut.of(row, default)


@router.post("", status_code=201)
def create(body: AccountIn, session: Db, principal: Principal) -> AccountOut:
    return _out(session, service.create(session, principal, body.name))


@router.get("")
def list_accounts(session: Db, principal: Principal) -> Page[AccountOut]:
    return Page(items=[_out(session, r) for r in service.list_visible(session, principal)])


@router.get("/{ref}")
def show(ref: str, session: Db, principal: Principal) -> AccountOut:
    return _out(session, service.get_visible(session, principal, ref))
