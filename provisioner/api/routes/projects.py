"""/v1/projects: create, list, show, remove the projects of the caller's account (services/projects.py).
Another account's project answers 404 with the same body as a missing one."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter
from pydantic import BaseModel, Field

from provisioner.api.deps import Db, Principal
from provisioner.api.errors import documented
from provisioner.api.schemas import Page
from provisioner.services import accounts
from provisioner.services import projects as service
from provisioner.store.account_models import Project

router = APIRouter(prefix="/v1/projects", tags=["projects"], responses=documented(403))


class ProjectIn(BaseModel):
    name: str = Field(max_length=63, description="a DNS label, unique among the account's projects")
    description: str | None = Field(None, max_length=service.DESCRIPTION_MAX)


class ProjectOut(BaseModel):
    id: str
    name: str
    account_id: str
    account: str
    default: bool = Field(description="where a job goes when none is named; cannot be removed")
    description: str | None
    created_at: datetime
    removed_at: datetime | None

    @classmethod
    def of(cls, row: Project) -> ProjectOut:
        return cls(
            id=row.id,
            name=row.name,
            account_id=row.account_id,
            account=row.account.name,
            default=row.default,
            description=row.description,
            created_at=row.created_at,
            removed_at=row.removed_at,
        )


@router.post("", status_code=201)
def create(body: ProjectIn, session: Db, principal: Principal) -> ProjectOut:
    return ProjectOut.of(service.create(session, principal, body.name, description=body.description))


@router.get("")
def list_projects(session: Db, principal: Principal) -> Page[ProjectOut]:
    return Page(items=[ProjectOut.of(r) for r in service.list_all(session, principal.account_id)])


@router.get("/{ref}")
def show(ref: str, session: Db, principal: Principal) -> ProjectOut:
    return ProjectOut.of(accounts.project_for(session, principal, ref))


@router.delete("/{ref}")
def remove(ref: str, session: Db, principal: Principal) -> ProjectOut:
    return ProjectOut.of(service.remove(session, principal, ref))
