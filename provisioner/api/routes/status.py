"""/v1/status: the fleet at a glance (services/fleet/fleet_status.py), and what `provision doctor`
compares."""

from __future__ import annotations

from datetime import datetime
from importlib import metadata
from typing import Any

from alembic.runtime.migration import MigrationContext
from fastapi import APIRouter
from pydantic import BaseModel

from provisioner.api.deps import Db, Principal
from provisioner.domain.states import JobState
from provisioner.services.fleet import fleet_status
from provisioner.services.jobs import fleet_summary

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
    gpus: int = 0
    gpus_allocated: int = 0  # held by a starting or running worker


class StatusOut(BaseModel):
    at: datetime
    version: str
    schema_revision: str | None
    regions: list[RegionStatus]
    refusals_24h: int
    jobs_running: int = 0  # the caller's account's (every account's for a fleet admin)
    jobs_waiting: int = 0
    oldest_wait_s: float = 0.0


def server_version() -> str:
    try:
        return metadata.version("rigbase")
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        return "unknown"


@router.get("")
def status(session: Db, principal: Principal) -> StatusOut:
    """The fleet at a glance: nodes, GPUs free and held, jobs running and waiting; with the server's
    version and schema revision (for `provision doctor`)."""
    heads = MigrationContext.configure(session.connection()).get_current_heads()
    data: dict[str, Any] = fleet_status.status(session)
    gpus = fleet_summary.fleet(session).gpus_by_region()
    for row in data["regions"]:
        held = gpus.get(row["region"], fleet_summary.GpuCount())
        row |= {"gpus": held.total, "gpus_allocated": held.allocated}
    jobs = fleet_summary.jobs(session, principal.account_scope())
    return StatusOut(
        **data,
        jobs_running=jobs.in_state(JobState.RUNNING),
        jobs_waiting=jobs.waiting,
        oldest_wait_s=jobs.oldest_wait_s,
        version=server_version(),
        schema_revision=",".join(sorted(heads)) or None,
    )
