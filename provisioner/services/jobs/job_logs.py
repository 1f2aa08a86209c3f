"""Worker logs: the minion posts each worker's combined stdout/stderr as LogChunks (contracts.jobs) over its
outbound connection; operators read them back in order (`provision job logs NAME [--worker N] [--follow]`).

Stored idempotently by byte offset: a chunk that starts past what is held (a gap) is not stored and the
answer's `acked` tells the minion where to resend from; a chunk that overlaps what is held adds only its
new tail; a resent chunk adds nothing. `acked` (JobWorker.log_bytes) is always the number of bytes held
without a gap from offset 0, so a restart of either side resumes exactly there and no line is lost or
stored twice. The metric lines of what is stored are read as it arrives (job_metrics.py)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol

from sqlalchemy import select
from sqlalchemy.orm import Session

from contracts.errors import InvalidInput, NotFound
from contracts.jobs import LogAck, LogChunk
from provisioner.domain.roles import Principal
from provisioner.domain.states import WORKER_DONE, WorkerState
from provisioner.services.common.errors import flush
from provisioner.services.fleet import node_credentials
from provisioner.services.jobs import job_metrics, jobs
from provisioner.store.job_models import Job, JobLogChunk, JobWorker

READ_MAX = 1024 * 1024  # bytes one read answers at most; the reader asks again from next_offset
# A worker that ended without its minion sending the log's end (its node was lost) is complete this long
# after it ended, so `job logs --follow` ends too.
LOG_SETTLE = timedelta(seconds=30)


class StoredChunk(Protocol):
    """A stored piece of a log (JobLogChunk, DeviceLogChunk): its bytes' start and its text."""

    @property
    def offset(self) -> int: ...

    @property
    def data(self) -> str: ...


def joined(chunks: Iterable[StoredChunk], offset: int) -> tuple[str, int]:
    """The text of `chunks` (in offset order, each ending past `offset`) from byte `offset` on, at most about
    READ_MAX bytes, and the byte offset it ends at (where the reader asks again)."""
    parts: list[bytes] = []
    position = offset
    for chunk in chunks:
        raw = chunk.data.encode()
        if chunk.offset < position:
            raw = raw[position - chunk.offset :]
        parts.append(raw)
        position += len(raw)
        if position - offset >= READ_MAX:
            break
    return b"".join(parts).decode(errors="replace"), position


def append(
    session: Session, node_id: str, credential: str | None, job_id: str, worker: int, chunk: LogChunk
) -> LogAck:
    """Store one chunk from the node that runs this worker (module docstring)."""
    node, _ = node_credentials.node_for_credential(session, node_id, credential)
    row = session.scalar(select(JobWorker).where(JobWorker.job_id == job_id, JobWorker.index == worker))
    if row is None or row.node_id != node.id:
        raise NotFound(
            f"worker {worker} of job '{job_id}' does not run on this node: drop its log",
            code="worker_not_here",
        )
    data = chunk.data.encode()
    end = chunk.offset + len(data)
    held = row.log_bytes
    if chunk.offset <= held < end:
        tail = data[held - chunk.offset :]
        session.add(
            JobLogChunk(
                job_id=job_id, worker=worker, offset=held, size=len(tail), data=tail.decode(errors="replace")
            )
        )
        row.log_bytes = held = end
    if chunk.eof and chunk.offset <= held and end == held:
        row.log_complete = True
    flush(session, f"the log of worker {worker} of job '{job_id}'")
    job_metrics.scan(session, job_id, row, final=row.log_complete)
    flush(session, f"the metrics of worker {worker} of job '{job_id}'")
    return LogAck(acked=held, eof=row.log_complete)


@dataclass(frozen=True)
class LogPage:
    """Bytes [offset, next_offset) of one worker's log; `complete`: nothing more will come (the minion
    sent its end, or the worker ended and the job is over)."""

    job_id: str
    job_state: str
    worker: int
    worker_state: str
    offset: int
    next_offset: int
    data: str
    complete: bool
    # what became of the metric lines in it, when some were refused or dropped (one line; None: none)
    metrics_notice: str | None = None


def read(session: Session, principal: Principal, ref: str, worker: int, offset: int = 0) -> LogPage:
    """What is stored of one worker's log from `offset` (the caller's job only; 404 otherwise)."""
    job: Job = jobs.get(session, principal, ref)
    row = next((w for w in job.workers if w.index == worker), None)
    if row is None:
        raise InvalidInput(
            f"job '{job.name}' has workers 0-{len(job.workers) - 1}: choose one of them with --worker",
            code="no_such_worker",
        )
    if offset < 0:
        raise InvalidInput("offset must be 0 or more", code="invalid_offset")
    chunks = session.scalars(
        select(JobLogChunk)
        .where(
            JobLogChunk.job_id == job.id,
            JobLogChunk.worker == worker,
            JobLogChunk.offset + JobLogChunk.size > offset,
        )
        .order_by(JobLogChunk.offset)
    )
    data, position = joined(chunks, offset)
    settled = WorkerState(row.state) in WORKER_DONE and (
        row.node_id is None or datetime.now(UTC) - row.updated_at > LOG_SETTLE
    )
    return LogPage(
        job_id=job.id,
        job_state=job.state,
        worker=worker,
        worker_state=row.state,
        offset=offset,
        next_offset=position,
        data=data,
        complete=(row.log_complete or settled) and position >= row.log_bytes,
        metrics_notice=job_metrics.notice(row),
    )
