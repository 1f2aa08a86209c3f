"""Autostop (docs/job-urls.md, "Autostop"): a notebook or endpoint whose server has been idle for its
`autostop_minutes` is stopped, with the reason, and its GPUs go back to the fleet.

The node measures idleness (contracts/jobs.py WorkerReport.idle_s: Jupyter's own activity with no
connection open, or an endpoint's last connection through the tunnel); the control plane keeps since when
(job_workers.idle_since) and decides here, at the report, so the rule holds whichever process answers."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from contracts.jobs import WorkerReport
from contracts.jobspec import JobSpec, JobType
from provisioner.domain.states import JOB_DONE, JobState
from provisioner.services.jobs import jobs
from provisioner.store.job_models import Job, JobWorker

ACTOR = "rigbase:autostop"


def minutes_of(job: Job) -> int:
    """The job's own `autostop_minutes`; else, for a notebook, its project's notebook autostop; else the
    type's default. Read at each report, so a project's new default reaches its running notebooks."""
    spec = JobSpec.model_validate(job.spec)
    project_default = job.project.notebook_autostop_minutes
    if spec.autostop_minutes is None and spec.type is JobType.NOTEBOOK and project_default is not None:
        return project_default
    return spec.autostop


def left_s(job: Job, worker: JobWorker, now: datetime) -> float | None:
    """Seconds until the job autostops, as its idle time stands (the console shows it); None: never."""
    minutes = minutes_of(job)
    if not minutes or worker.idle_since is None or JobState(job.state) is not JobState.RUNNING:
        return None
    return max(0.0, minutes * 60 - (now - worker.idle_since).total_seconds())


def record(session: Session, worker: JobWorker, report: WorkerReport, now: datetime) -> None:
    """Keep worker 0's idle time; stop its job once it has been idle for its autostop."""
    if worker.index != 0:
        return
    if report.idle_s is None:
        worker.idle_since = None
        return
    worker.idle_since = now - timedelta(seconds=report.idle_s)
    job = worker.job
    minutes = minutes_of(job)
    if not minutes or report.idle_s < minutes * 60 or JobState(job.state) in JOB_DONE:
        return
    what = (
        "no kernel activity and no connection"
        if JobType(job.type) is JobType.NOTEBOOK
        else "no request through its URL"
    )
    reason = f"autostopped: idle for {minutes} min ({what})"
    jobs.stop_as(session, job, actor=ACTOR, reason=reason)
