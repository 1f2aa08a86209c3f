"""What a worker's attempt has left: its stored log, the metric points read from it and its usage samples.
A job that is re-queued before it ran (its node was lost, its burst VM preempted) starts them over."""

from __future__ import annotations

from sqlalchemy import delete
from sqlalchemy.orm import Session

from provisioner.store.job_models import Job, JobLogChunk, JobMetric, JobWorker, WorkerUsageSample


def start_over(session: Session, job: Job) -> None:
    """Drop the job's logs, metrics and usage; each worker's counters back to nothing."""
    for worker in job.workers:
        _reset(worker)
    session.execute(delete(JobLogChunk).where(JobLogChunk.job_id == job.id))
    session.execute(delete(JobMetric).where(JobMetric.job_id == job.id))
    session.execute(delete(WorkerUsageSample).where(WorkerUsageSample.job_id == job.id))


def _reset(worker: JobWorker) -> None:
    worker.log_bytes = 0
    worker.log_complete = False
    worker.metrics_scanned = 0
    worker.metric_points = worker.metrics_dropped = worker.metrics_refused = 0
    worker.metrics_refusal = None
    worker.usage_at = None
