"""A notebook's or endpoint's URL and who may use it (docs/job-urls.md): the job that a /j/JOB_ID/ path
names, checked for the caller, and the notebook's Jupyter token.

The proxy itself lives in the API (provisioner/api/job_proxy.py); this module holds the rules it asks:
which worker serves, whether it is ready, and whether the caller may reach it."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from contracts.errors import Conflict, Gone, NotFound
from contracts.jobspec import JobSpec, JobType
from provisioner.domain.roles import Principal
from provisioner.domain.served_jobs import SERVED, job_path, notebook_token, serve_binding
from provisioner.domain.states import JOB_DONE, JobState, WorkerState
from provisioner.services.common.runtime import runtime_of
from provisioner.store.job_models import Job, JobWorker


@dataclass(frozen=True)
class Served:
    """Where a job's URL leads now: worker 0's node and port, and who may use it."""

    job_id: str
    account_id: str
    node_id: str
    worker: int
    port: int
    notebook: bool
    public: bool
    token: str | None  # the notebook's Jupyter token (the proxy sends it upstream for the caller)


def token_of(session: Session, job_id: str) -> str:
    sealer = runtime_of(session).sealer
    if not sealer.key_path.exists():
        sealer.seal(b"")  # creates the key file race-free
    return notebook_token(sealer.key_path.read_bytes().strip(), job_id)


def _not_found(job_id: str) -> NotFound:
    return NotFound(f"no notebook or endpoint job '{job_id}': see `provision job list`", code="job_not_found")


def _job(session: Session, job_id: str) -> Job:
    job = session.get(Job, job_id)
    if job is None or JobType(job.type) not in SERVED:
        raise _not_found(job_id)
    return job


def is_public(session: Session, job_id: str) -> bool:
    """An endpoint whose spec says `public: true` (anyone with the URL may call it)."""
    job = session.get(Job, job_id)
    if job is None or JobType(job.type) is not JobType.ENDPOINT:
        return False
    return bool((job.spec.get("endpoint") or {}).get("public"))


def may_use(principal: Principal, job: Job) -> bool:
    """A job's URL, its notebook token and `job connect` are its own account's only: root admins, who see
    every account's jobs, do not get into another account's notebook or server."""
    return principal.account_id == job.account_id


def served(session: Session, job_id: str, principal: Principal | None) -> Served:
    """The worker the URL of `job_id` reaches, for `principal` (None: no credential, which only a public
    endpoint takes). Another account's job is NotFound, as a missing one; an ended job is Gone (410) with
    its state; one not yet serving is a Conflict whose message is its reason."""
    job = _job(session, job_id)
    public = is_public(session, job_id)
    if principal is not None and not may_use(principal, job):
        raise _not_found(job_id)
    if principal is None and not public:
        raise _not_found(job_id)
    state = JobState(job.state)
    if state in JOB_DONE:
        raise Gone(f"job '{job.name}' has ended ({state.value}): its URL is closed", code="job_ended")
    spec = JobSpec.model_validate(job.spec)
    binding = serve_binding(spec, job.id)
    if binding is None:
        raise NotFound(
            f"endpoint '{job.name}' names no port: add `endpoint: {{port: …}}` to its spec",
            code="job_serves_nothing",
        )
    return Served(
        job_id=job.id,
        account_id=job.account_id,
        node_id=served_worker(session, job),
        worker=0,
        port=binding.port,
        notebook=JobType(job.type) is JobType.NOTEBOOK,
        public=public,
        token=token_of(session, job.id) if JobType(job.type) is JobType.NOTEBOOK else None,
    )


def served_worker(session: Session, job: Job) -> str:
    """The node where worker 0 of `job` runs now (what `provision job connect` reaches); Gone once the
    job ended, Conflict (with its reason) while it is not running yet."""
    state = JobState(job.state)
    if state in JOB_DONE:
        raise Gone(f"job '{job.name}' has ended ({state.value}): its URL is closed", code="job_ended")
    worker = session.scalar(select(JobWorker).where(JobWorker.job_id == job.id, JobWorker.index == 0))
    if worker is None or worker.node_id is None or WorkerState(worker.state) is not WorkerState.RUNNING:
        reason = job.reason or f"it is {state.value}"
        raise Conflict(f"job '{job.name}' is not serving yet: {reason}", code="job_not_serving")
    return worker.node_id


def url_of(base_url: str, job: Job) -> str | None:
    """The job's URL on the control plane at `base_url`; None for a job that serves nothing."""
    if JobType(job.type) not in SERVED:
        return None
    return base_url.rstrip("/") + job_path(job.id)
