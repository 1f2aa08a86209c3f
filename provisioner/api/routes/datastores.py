"""/v1/datastores: add, list, show, remove. The SMB password goes in, never out."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter
from pydantic import BaseModel, Field

from provisioner.api.deps import Db, Operator
from provisioner.api.schemas import Page
from provisioner.services.data import datastores as service
from provisioner.store.regional_models import Datastore

router = APIRouter(prefix="/v1/datastores", tags=["datastores"])


class DatastoreIn(BaseModel):
    name: str
    region: str
    type: str = Field(description="nfs or smb")
    address: str
    root: str = Field(description="absolute path on the server; jobs never reach above it")
    username: str | None = Field(None, description="SMB only")
    password: str | None = Field(None, description="SMB only; sealed at rest, never returned")


class DatastoreOut(BaseModel):
    id: str
    name: str
    region: str
    region_id: str
    type: str
    address: str
    root: str
    username: str | None
    has_password: bool
    state: str
    reason: str | None
    created_at: datetime

    @classmethod
    def of(cls, d: Datastore) -> DatastoreOut:
        return cls(
            id=d.id,
            name=d.name,
            region=d.region.name,
            region_id=d.region_id,
            type=d.type,
            address=d.address,
            root=d.root,
            username=d.username,
            has_password=d.sealed_password is not None,
            state=d.state,
            reason=d.reason,
            created_at=d.created_at,
        )


@router.post("", status_code=201)
def add(body: DatastoreIn, session: Db, actor: Operator) -> DatastoreOut:
    return DatastoreOut.of(
        service.add(
            session,
            body.name,
            region=body.region,
            type=body.type,
            address=body.address,
            root=body.root,
            username=body.username,
            password=body.password,
            actor=actor,
        )
    )


@router.get("")
def list_datastores(session: Db, region: str | None = None) -> Page[DatastoreOut]:
    return Page(items=[DatastoreOut.of(d) for d in service.list_all(session, region)])


@router.get("/{ref}")
def show(ref: str, session: Db, region: str | None = None) -> DatastoreOut:
    return DatastoreOut.of(service.get(session, ref, region))


@router.delete("/{ref}")
def remove(ref: str, session: Db, actor: Operator, region: str | None = None) -> DatastoreOut:
    return DatastoreOut.of(service.remove(session, ref, region=region, actor=actor))
