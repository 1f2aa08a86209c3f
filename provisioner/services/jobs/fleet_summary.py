"""The fleet in numbers: nodes by region, state and GPU type; GPUs total, allocated and healthy; jobs by
state; the waiting queue. One reading for GET /metrics (every account's, api/fleet_metrics.py) and for
the console's dashboard (what the signed-in account sees: its session's rows are scoped to it,
store/row_scope.py, and its jobs are picked by `account_id`).

A GPU is allocated while a starting or running worker holds it, and healthy while its node is active and
has beaten within the online window."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final

from sqlalchemy import ColumnElement, func, or_, select, true
from sqlalchemy.orm import Session

from provisioner.domain.states import ONLINE_WINDOW, WORKER_ON_NODE, JobState, NodeState
from provisioner.store.account_models import Project
from provisioner.store.job_models import Job, JobWorker
from provisioner.store.models import Node, Region

NO_GPU: Final = "none"


@dataclass(frozen=True)
class GpuCount:
    total: int = 0
    allocated: int = 0
    healthy: int = 0


@dataclass
class Fleet:
    nodes: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # (region, state, gpu type)
    gpus: dict[tuple[str, str], GpuCount] = field(default_factory=dict)  # (region, gpu type)

    def gpus_by_type(self) -> dict[str, GpuCount]:
        return self._summed(lambda region, gpu_type: gpu_type)

    def gpus_by_region(self) -> dict[str, GpuCount]:
        return self._summed(lambda region, gpu_type: region)

    def _summed(self, key: Callable[[str, str], str]) -> dict[str, GpuCount]:
        out: dict[str, GpuCount] = {}
        for (region, gpu_type), n in sorted(self.gpus.items()):
            was = out.get(key(region, gpu_type), GpuCount())
            out[key(region, gpu_type)] = GpuCount(
                was.total + n.total, was.allocated + n.allocated, was.healthy + n.healthy
            )
        return out


def fleet(session: Session, now: datetime | None = None) -> Fleet:
    """Every node the session sees (removed ones aside) and its GPUs."""
    online_since = (now or datetime.now(UTC)) - ONLINE_WINDOW
    allocated: Counter[str | None] = Counter()
    for node_id, indices in session.execute(
        select(JobWorker.node_id, JobWorker.gpu_indices).where(
            JobWorker.node_id.is_not(None), JobWorker.state.in_([s.value for s in WORKER_ON_NODE])
        )
    ):
        allocated[node_id] += len(indices or [])
    out = Fleet()
    # the GPU count and type the store keeps beside each report: decoding 10,000 inventories (6 KiB of
    # JSON each) took a scrape more than half a second
    rows = session.execute(
        select(Node.id, Region.name, Node.state, Node.gpu_count, Node.gpu_type, Node.last_heartbeat_at)
        .join(Region, Region.id == Node.region_id)
        .where(Node.state != NodeState.REMOVED.value)
    )
    for node_id, region, state, total, model, beat in rows:
        gpu_type = (model or NO_GPU) if total else NO_GPU
        out.nodes[(region, state, gpu_type)] += 1
        if not total:
            continue
        healthy = state == NodeState.ACTIVE.value and beat is not None and _aware(beat) >= online_since
        was = out.gpus.get((region, gpu_type), GpuCount())
        out.gpus[(region, gpu_type)] = GpuCount(
            was.total + total,
            was.allocated + min(total, allocated[node_id]),
            was.healthy + (total if healthy else 0),
        )
    return out


@dataclass(frozen=True)
class Jobs:
    by_state: dict[tuple[str, str], int]  # (state, type) → jobs
    waiting: int
    oldest_wait_s: float  # how long the oldest waiting job has waited (0: none waits)

    def in_state(self, state: JobState) -> int:
        return sum(n for (s, _), n in self.by_state.items() if s == state.value)


def jobs(session: Session, account_id: str | None = None, now: datetime | None = None) -> Jobs:
    """Jobs by state and type, and the waiting queue: every account's, or those of `account_id`'s
    projects and those it created."""
    mine: ColumnElement[bool] = true()
    if account_id is not None:
        own = select(Project.id).where(Project.account_id == account_id)
        mine = or_(Job.project_id.in_(own), Job.account_id == account_id)
    by_state = {
        (state, kind): n
        for state, kind, n in session.execute(
            select(Job.state, Job.type, func.count()).where(mine).group_by(Job.state, Job.type)
        )
    }
    waiting, oldest = session.execute(
        select(func.count(), func.min(Job.created_at)).where(mine, Job.state == JobState.WAITING.value)
    ).one()
    age = 0.0 if oldest is None else ((now or datetime.now(UTC)) - _aware(oldest)).total_seconds()
    return Jobs(by_state=by_state, waiting=int(waiting), oldest_wait_s=max(0.0, age))


def _aware(at: datetime) -> datetime:
    return at if at.tzinfo else at.replace(tzinfo=UTC)
