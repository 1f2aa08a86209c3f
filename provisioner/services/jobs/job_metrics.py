"""Job metrics: the `rigbase:metric {…}` lines of a worker's log (contracts/metrics.py), read as its log
is stored, kept per job, worker, name and step, and read back in the order they came
(`provision job metrics NAME`, GET /v1/jobs/{ref}/metrics; docs/job-metrics.md).

A worker's log is read line by line from `metrics_scanned`, always a line's start, up to the last whole
line held: a line split across two chunks is read once its end arrives, and a resent chunk adds nothing
(the log store already dropped it). A line that is not a valid metric is counted and its reason kept;
past the job's bound points are counted and dropped. Neither touches the job."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from contracts.metrics import (
    MAX_LINE_BYTES,
    METRIC_POINTS_PER_JOB,
    MetricPoint,
    MetricRefused,
    is_metric_line,
    parse_line,
)
from provisioner.domain.roles import Principal
from provisioner.services.jobs import jobs
from provisioner.store.job_models import Job, JobLogChunk, JobMetric, JobWorker

READ_MAX: Final = 5000  # points one read answers at most; the reader asks again after its last id
REFUSAL_MAX: Final = 300  # characters of the last refusal kept


def _held_bytes(session: Session, job_id: str, worker: int, start: int, end: int) -> bytes:
    """The log's bytes [start, end) as stored (the chunks are contiguous below `log_bytes`)."""
    chunks = session.scalars(
        select(JobLogChunk)
        .where(
            JobLogChunk.job_id == job_id,
            JobLogChunk.worker == worker,
            JobLogChunk.offset + JobLogChunk.size > start,
            JobLogChunk.offset < end,
        )
        .order_by(JobLogChunk.offset)
    )
    out = bytearray()
    for chunk in chunks:
        raw = chunk.data.encode()
        out += raw[max(0, start + len(out) - chunk.offset) :]
    return bytes(out[: end - start])


def notice(row: JobWorker) -> str | None:
    """One line on what became of the worker's metric lines, when some were refused or dropped."""
    said = []
    if row.metrics_refused:
        said.append(f"{row.metrics_refused} metric line(s) refused, the last: {row.metrics_refusal}")
    if row.metrics_dropped:
        said.append(f"{row.metrics_dropped} point(s) dropped past the job's bound of {METRIC_POINTS_PER_JOB}")
    return f"worker {row.index}: " + "; ".join(said) if said else None


def _refuse(row: JobWorker, why: str) -> None:
    row.metrics_refused += 1
    row.metrics_refusal = why[:REFUSAL_MAX]


def scan(session: Session, job_id: str, row: JobWorker, *, final: bool = False) -> int:
    """Read the metric lines of `row`'s log stored since the last scan; how many points were kept.
    `final`: the log is complete, so a last line without a newline is read too."""
    start, end = row.metrics_scanned, row.log_bytes
    if end <= start:
        return 0
    data = _held_bytes(session, job_id, row.index, start, end)
    cut = data.rfind(b"\n") + 1
    if final:
        cut = len(data)
    elif cut == 0 and len(data) > MAX_LINE_BYTES:
        cut = len(data)  # no line ends within a metric line's bound: not a metric, skip what is held
    lines = data[:cut].decode(errors="replace").splitlines()
    row.metrics_scanned = start + cut
    points: list[MetricPoint] = []
    for line in lines:
        if not is_metric_line(line):
            continue
        try:
            points.extend(parse_line(line))
        except MetricRefused as exc:
            _refuse(row, str(exc))
    return _keep(session, job_id, row, points)


def _keep(session: Session, job_id: str, row: JobWorker, points: list[MetricPoint]) -> int:
    if not points:
        return 0
    held = session.scalar(select(func.sum(JobWorker.metric_points)).where(JobWorker.job_id == job_id)) or 0
    room = max(0, METRIC_POINTS_PER_JOB - int(held))
    kept, dropped = points[:room], points[room:]
    if dropped:
        row.metrics_dropped += len(dropped)
    if kept:
        now = datetime.now(UTC)
        # one executemany: a training loop prints thousands of points a minute
        session.execute(
            insert(JobMetric),
            [
                {
                    "job_id": job_id,
                    "worker": row.index,
                    "name": p.name,
                    "step": p.step,
                    "value": p.value,
                    "at": now,
                }
                for p in kept
            ],
        )
        row.metric_points += len(kept)
    return len(kept)


@dataclass(frozen=True)
class Point:
    id: int
    worker: int
    name: str
    step: int | None
    value: float
    at: datetime


@dataclass(frozen=True)
class WorkerMetrics:
    """What became of one worker's metric lines."""

    worker: int
    points: int
    dropped: int
    refused: int
    last_refusal: str | None
    notice: str | None  # the one line that says so (notice())


@dataclass(frozen=True)
class MetricsPage:
    job_id: str
    job_state: str
    points: list[Point]
    next_after: int  # ask again with after=next_after for what came since
    bound: int  # points a job keeps at most
    workers: list[WorkerMetrics]
    complete: bool  # the job ended and every worker's log was read: nothing more will come


def read(
    session: Session,
    principal: Principal,
    ref: str,
    *,
    after: int = 0,
    worker: int | None = None,
    names: Iterable[str] = (),
    limit: int = READ_MAX,
) -> MetricsPage:
    """The job's points after id `after`, in the order they came (the caller's job only; 404 otherwise)."""
    job: Job = jobs.get(session, principal, ref)
    stmt = select(JobMetric).where(JobMetric.job_id == job.id, JobMetric.id > after)
    if worker is not None:
        stmt = stmt.where(JobMetric.worker == worker)
    wanted = sorted(set(names))
    if wanted:
        stmt = stmt.where(JobMetric.name.in_(wanted))
    rows = list(session.scalars(stmt.order_by(JobMetric.id).limit(min(limit, READ_MAX))))
    points = [Point(r.id, r.worker, r.name, r.step, r.value, r.at) for r in rows]
    ended = job.ended_at is not None and all(w.log_complete or w.node_id is None for w in job.workers)
    return MetricsPage(
        job_id=job.id,
        job_state=job.state,
        points=points,
        next_after=points[-1].id if points else after,
        bound=METRIC_POINTS_PER_JOB,
        workers=[
            WorkerMetrics(
                w.index, w.metric_points, w.metrics_dropped, w.metrics_refused, w.metrics_refusal, notice(w)
            )
            for w in job.workers
        ],
        complete=ended and len(rows) < min(limit, READ_MAX),
    )
