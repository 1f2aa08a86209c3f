"""/v1/projects: create, list, show, remove the projects of the caller's account, and share them with
other accounts (services/accounts/projects.py). A project shared with the caller's account is listed and shown
too (as `OWNER/PROJECT`); another account's project not shared with it answers 404 with the same body as
a missing one."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session

from contracts.jobspec import AUTOSTOP_MAX_MINUTES, NOTEBOOK_AUTOSTOP_MINUTES
from provisioner.api import convertors  # noqa: F401  (registers {ref:anypath})
from provisioner.api.deps import Db, Principal
from provisioner.api.errors import documented
from provisioner.api.schemas import Page
from provisioner.domain.roles import Principal as PrincipalValue
from provisioner.services.accounts import accounts
from provisioner.services.accounts import projects as service
from provisioner.store.account_models import Project

router = APIRouter(prefix="/v1/projects", tags=["projects"], responses=documented(403))


_AUTOSTOP = "minutes a notebook of the project that names no autostop may be idle before it is stopped "
_AUTOSTOP += f"(0: never; null: {NOTEBOOK_AUTOSTOP_MINUTES})"


class ProjectIn(BaseModel):
    name: str = Field(max_length=63, description="a DNS label, unique among the account's projects")
    description: str | None = Field(None, max_length=service.DESCRIPTION_MAX)
    notebook_autostop_minutes: int | None = Field(None, ge=0, le=AUTOSTOP_MAX_MINUTES, description=_AUTOSTOP)


class ProjectPatch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    notebook_autostop_minutes: int | None = Field(ge=0, le=AUTOSTOP_MAX_MINUTES, description=_AUTOSTOP)


class ShareIn(BaseModel):
    account: str = Field(max_length=63, description="the account (name or id) to share the project with")


class ProjectOut(BaseModel):
    id: str
    name: str
    ref: str = Field(description="how the caller names it: NAME for its own, OWNER/NAME for a shared one")
    account_id: str
    account: str
    default: bool = Field(description="where a job goes when none is named; cannot be removed")
    shared: bool = Field(False, description="another account's project, shared with the caller's account")
    shared_with: list[str] = Field(
        default_factory=list,
        description="the accounts it is shared with (their jobs here are federated); the owner's view only",
    )
    description: str | None
    notebook_autostop_minutes: int | None = Field(description=_AUTOSTOP)
    created_at: datetime
    removed_at: datetime | None

    @classmethod
    def of(cls, row: Project, *, shared: bool = False, shared_with: list[str] | None = None) -> ProjectOut:
        return cls(
            id=row.id,
            name=row.name,
            ref=f"{row.account.name}/{row.name}" if shared else row.name,
            account_id=row.account_id,
            account=row.account.name,
            default=row.default,
            shared=shared,
            shared_with=shared_with or [],
            description=row.description,
            notebook_autostop_minutes=row.notebook_autostop_minutes,
            created_at=row.created_at,
            removed_at=row.removed_at,
        )


def _out(session: Session, principal: PrincipalValue, row: Project) -> ProjectOut:
    if row.account_id != principal.account_id:
        return ProjectOut.of(row, shared=True)
    return ProjectOut.of(row, shared_with=[s.account.name for s in service.shares_of(session, row)])


@router.post("", status_code=201)
def create(body: ProjectIn, session: Db, principal: Principal) -> ProjectOut:
    row = service.create(
        session,
        principal,
        body.name,
        description=body.description,
        notebook_autostop_minutes=body.notebook_autostop_minutes,
    )
    return ProjectOut.of(row)


@router.patch("/{ref}")
def update(ref: str, body: ProjectPatch, session: Db, principal: Principal) -> ProjectOut:
    """Change one of the caller's projects: its notebooks' default autostop."""
    row = service.set_notebook_autostop(session, principal, ref, body.notebook_autostop_minutes)
    return _out(session, principal, row)


@router.get("")
def list_projects(session: Db, principal: Principal) -> Page[ProjectOut]:
    own = [_out(session, principal, r) for r in service.list_all(session, principal.account_id)]
    shared = [
        ProjectOut.of(r, shared=True) for r in service.shared_with_account(session, principal.account_id)
    ]
    return Page(items=own + shared)


@router.post("/{ref:anypath}/shares", status_code=201)
def share(ref: str, body: ShareIn, session: Db, principal: Principal) -> ProjectOut:
    """Share one of the caller's projects with another account (admins only)."""
    return _out(session, principal, service.share(session, principal, ref, body.account))


@router.delete("/{ref:anypath}/shares/{account}")
def unshare(ref: str, account: str, session: Db, principal: Principal) -> ProjectOut:
    """Stop sharing: the account creates no more jobs here; the jobs it created stay visible to both."""
    return _out(session, principal, service.unshare(session, principal, ref, account))


@router.delete("/{ref}")
def remove(ref: str, session: Db, principal: Principal) -> ProjectOut:
    return ProjectOut.of(service.remove(session, principal, ref))


@router.get("/{ref:anypath}")
def show(ref: str, session: Db, principal: Principal) -> ProjectOut:
    """A project by name or id, or `OWNER/PROJECT` for one shared with the caller's account."""
    return _out(session, principal, accounts.project_for(session, principal, ref))
