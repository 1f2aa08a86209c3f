"""Hardware use per worker: the samples minions send in their reports (contracts/jobs.py WorkerUsage),
kept as a rolling window (docs/job-metrics.md, "Hardware use").

- A report carries a worker's last few samples; those newer than the newest kept (`usage_at`) are
  stored, so a lost or repeated beat neither loses nor doubles one.
- Samples older than RAW_WINDOW are folded into the mean of each PERIOD (`resolution_s` = PERIOD), once
  per jobs reconciler pass, and anything older than KEEP is dropped: a week-long job keeps about
  360 + 2,000 rows per worker."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import delete, insert, select
from sqlalchemy.orm import Session

from contracts.jobs import WorkerUsage
from contracts.jobspec import JobSpec
from provisioner.domain.roles import Principal
from provisioner.services.jobs import jobs
from provisioner.store.job_models import Job, JobWorker, WorkerUsageSample

RAW_WINDOW: Final = 3600.0  # seconds of samples kept as the minion sent them
PERIOD: Final = 300  # older samples are kept as 5-minute means
KEEP: Final = 7 * 86400.0  # and dropped after a week
COMPACT_BATCH: Final = 50_000  # raw rows one pass folds at most
READ_MAX: Final = 5000
BYTES: Final = ("memory_bytes", "disk_bytes", "net_rx_bytes", "net_tx_bytes")


def record(session: Session, worker: JobWorker, samples: Sequence[WorkerUsage]) -> int:
    """Store the report's samples newer than what is kept; how many were new."""
    newer = [s for s in samples if worker.usage_at is None or s.at > worker.usage_at]
    if not newer:
        return 0
    session.execute(
        insert(WorkerUsageSample),
        [
            {
                "job_id": worker.job_id,
                "worker": worker.index,
                "at": s.at,
                "resolution_s": 0,
                "cpu_cores": s.cpu_cores,
                "memory_bytes": s.memory_bytes,
                "disk_bytes": s.disk_bytes,
                "net_rx_bytes": s.net_rx_bytes,
                "net_tx_bytes": s.net_tx_bytes,
                "gpus": [g.model_dump(mode="json") for g in s.gpus],
            }
            for s in newer
        ],
    )
    worker.usage_at = max(s.at for s in newer)
    return len(newer)


def _mean_gpus(rows: Sequence[WorkerUsageSample]) -> list[dict[str, Any]]:
    by_index: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        for gpu in row.gpus or []:
            by_index.setdefault(int(gpu["index"]), []).append(gpu)
    return [
        {"index": index, **{k: sum(g[k] for g in seen) / len(seen) for k in seen[0] if k != "index"}}
        for index, seen in sorted(by_index.items())
    ]


def compact(session: Session, now: float | None = None) -> int:
    """Fold raw samples older than RAW_WINDOW into PERIOD means, drop what is older than KEEP; how many
    raw samples were folded (a pass folds at most COMPACT_BATCH; the next pass goes on)."""
    now = time.time() if now is None else now
    session.execute(delete(WorkerUsageSample).where(WorkerUsageSample.at < now - KEEP))
    rows = list(
        session.scalars(
            select(WorkerUsageSample)
            .where(WorkerUsageSample.resolution_s == 0, WorkerUsageSample.at < now - RAW_WINDOW)
            .order_by(WorkerUsageSample.job_id, WorkerUsageSample.worker, WorkerUsageSample.at)
            .limit(COMPACT_BATCH)
        )
    )
    groups: dict[tuple[str, int, float], list[WorkerUsageSample]] = {}
    for row in rows:
        groups.setdefault((row.job_id, row.worker, row.at - row.at % PERIOD), []).append(row)
    means = [
        {
            "job_id": job_id,
            "worker": worker,
            "at": start,
            "resolution_s": PERIOD,
            "cpu_cores": sum(r.cpu_cores for r in group) / len(group),
            **{k: int(sum(getattr(r, k) for r in group) / len(group)) for k in BYTES},
            "gpus": _mean_gpus(group),
        }
        for (job_id, worker, start), group in groups.items()
    ]
    if means:
        session.execute(insert(WorkerUsageSample), means)
        session.execute(delete(WorkerUsageSample).where(WorkerUsageSample.id.in_([r.id for r in rows])))
    return len(rows)


@dataclass(frozen=True)
class UsagePage:
    job_id: str
    job_state: str
    disk_gb: int  # each worker's disk quota (0: none)
    samples: list[WorkerUsageSample]


def read(
    session: Session, principal: Principal, ref: str, *, worker: int | None = None, since: float = 0.0
) -> UsagePage:
    """The job's samples after `since` (Unix time), oldest first (the caller's job only)."""
    job: Job = jobs.get(session, principal, ref)
    stmt = select(WorkerUsageSample).where(WorkerUsageSample.job_id == job.id, WorkerUsageSample.at > since)
    if worker is not None:
        stmt = stmt.where(WorkerUsageSample.worker == worker)
    rows = list(
        session.scalars(stmt.order_by(WorkerUsageSample.at.desc(), WorkerUsageSample.worker).limit(READ_MAX))
    )
    plan = JobSpec.model_validate(job.spec).plan()
    return UsagePage(
        job_id=job.id,
        job_state=job.state,
        # a worker's disk (its group's); of every worker, the largest
        disk_gb=plan[worker].resources.disk_size
        if worker is not None and worker < len(plan)
        else max(w.resources.disk_size for w in plan),
        samples=rows[::-1],
    )
