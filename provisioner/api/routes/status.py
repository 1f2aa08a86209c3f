"""/v1/status: the fleet at a glance (services/fleet/fleet_status.py), and what `provision doctor`
compares."""

from __future__ import annotations

from datetime import datetime
from importlib import metadata
from typing import Any

from alembic.runtime.migration import MigrationContext
from fastapi import APIRouter
from pydantic import BaseModel

from provisioner.api.deps import Db
from provisioner.services.fleet import fleet_status

router = APIRouter(prefix="/v1/status", tags=["status"])


class RegionStatus(BaseModel):
    region: str
    provider: str
    state: str
    nodes: int
    by_state: dict[str, int]
    nodes_active: int
    nodes_offline: int
    nodes_errored: int
    minions_pending: int
    join_tokens: int
    join_tokens_expiring: int


class StatusOut(BaseModel):
    at: datetime
    version: str
    schema_revision: str | None
    regions: list[RegionStatus]
    refusals_24h: int


def server_version() -> str:
    try:
        return metadata.version("rigbase")
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        return "unknown"


@router.get("")
def status(session: Db) -> StatusOut:
    """The fleet at a glance, with the server's version and schema revision (for `provision doctor`)."""
    heads = MigrationContext.configure(session.connection()).get_current_heads()
    data: dict[str, Any] = fleet_status.status(session)
    return StatusOut(**data, version=server_version(), schema_revision=",".join(sorted(heads)) or None)
