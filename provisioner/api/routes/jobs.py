"""/v1/jobs: create (or dry-run: the match table), list, show, history, stop, logs, and the published job
spec schema; every route is scoped to the caller's account (another account's job answers 404). And the
minion's log route, POST /v1/nodes/{node_id}/jobs/{job_id}/workers/{worker}/logs (node credential)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, ConfigDict, Field

from contracts.jobs import INT64_END, LOG_ROUTE, WORKER_NUMBERS, GpuUsage, LogAck, LogChunk
from contracts.jobspec import JobSpec, JobType, spec_from_data
from provisioner.api.deps import Db, NodeCredential, Principal
from provisioner.api.errors import NODE_ERRORS, documented
from provisioner.api.schemas import EventOut, Page
from provisioner.domain.placement_rows import match_rows
from provisioner.domain.served_jobs import SERVED, job_path
from provisioner.providers.base import Feature, provider_for
from provisioner.services.billing import job_cost
from provisioner.services.cloud import gcp_capacity
from provisioner.services.jobs import job_autostop, job_logs, job_metrics, job_usage
from provisioner.services.jobs import jobs as service
from provisioner.store.job_models import Job, JobWorker

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
node_router = APIRouter(tags=["jobs"])  # node credential auth (the app's OPEN_ROUTERS)
REJECTED_SHOWN = 50  # a dry run over a big fleet lists the closest misses, not every node


class JobIn(BaseModel):
    spec: dict[str, Any] = Field(
        description="a rigbase job spec (GET /v1/jobs/schema); `provision job create` "
        "converts ChainOpera Launch and OpenPAI files into one"
    )
    project: str | None = Field(
        None, description="project name or id; default: the account's default project"
    )


class WorkerOut(BaseModel):
    index: int
    group: str = Field("worker", description="its group (an OpenPAI task role); `worker` for `workers:`")
    group_index: int = 0
    gpu_count: int = 0
    state: str
    reason: str | None
    exit_code: int | None
    node: str | None
    node_id: str | None
    port: int | None = Field(None, description="the port its peers reach it on, on its node")
    gpu_indices: list[int]
    log_bytes: int
    started_at: datetime | None = None
    ended_at: datetime | None = None

    @classmethod
    def of(cls, w: JobWorker) -> WorkerOut:
        return cls(
            index=w.index,
            group=w.group_name,
            group_index=w.group_index,
            gpu_count=w.gpu_count,
            port=w.port,
            started_at=w.started_at,
            ended_at=w.ended_at,
            state=w.state,
            reason=w.reason,
            exit_code=w.exit_code,
            node=w.node.name if w.node is not None else None,
            node_id=w.node_id,
            gpu_indices=list(w.gpu_indices or []),
            log_bytes=w.log_bytes,
        )


class JobOut(BaseModel):
    id: str
    name: str
    type: str
    project: str
    project_id: str
    account_id: str = Field(description="the creator's account (it may differ from the project's owner)")
    federated: bool = Field(
        False,
        description="created by an account the project is shared with: the creator pays the federated fee",
    )
    state: str
    reason: str | None
    price_per_gpu_hour: float | None = Field(
        description="credits per GPU-hour, locked when the job was created"
    )
    gpu_type: str | None
    gpu_count: int
    region: str | None
    node: str | None
    workers: list[WorkerOut]
    spec: dict[str, Any]
    created_by: str
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    credits: Decimal | None = Field(
        None, description="credits the job's side paid so far (price, usage and federated fees); show only"
    )
    duration_s: float | None = Field(
        None, description="run time in seconds: from its start to its end, or to now (list and show)"
    )
    credits_so_far: Decimal | None = Field(
        None,
        description="credits in the ledger plus what the run accrued since the last hour was posted, by "
        "the same rules (list and show)",
    )
    credits_per_hour: Decimal | None = Field(
        None, description="what one more hour of the running job costs (list and show)"
    )
    url_path: str | None = Field(
        None,
        description="a notebook's or endpoint's URL on this control plane, /j/JOB_ID/ "
        "(docs/job-urls.md); null for other jobs",
    )
    autostop_minutes: int | None = Field(
        None,
        description="a notebook or endpoint idle this long is stopped (0: never): its own, else its "
        "project's notebook default, else the type's; null for other jobs",
    )

    def with_cost(self, cost: job_cost.JobCost) -> JobOut:
        return self.model_copy(
            update={
                "duration_s": cost.duration_s,
                "credits_so_far": cost.so_far,
                "credits_per_hour": cost.per_hour,
            }
        )

    @classmethod
    def of(cls, j: Job) -> JobOut:
        return cls(
            id=j.id,
            name=j.name,
            type=j.type,
            project=j.project.name,
            project_id=j.project_id,
            account_id=j.account_id,
            federated=j.account_id != j.project.account_id,
            state=j.state,
            reason=j.reason,
            price_per_gpu_hour=j.price_per_gpu_hour,
            gpu_type=j.gpu_type,
            gpu_count=max((w.gpu_count for w in j.workers), default=0),
            region=j.region.name if j.region is not None else None,
            node=j.node.name if j.node is not None else None,
            workers=[WorkerOut.of(w) for w in j.workers],
            spec=j.spec,
            created_by=j.created_by,
            created_at=j.created_at,
            updated_at=j.updated_at,
            started_at=j.started_at,
            ended_at=j.ended_at,
            url_path=job_path(j.id) if JobType(j.type) in SERVED else None,
            autostop_minutes=job_autostop.minutes_of(j) if JobType(j.type) in SERVED else None,
        )


class MatchRowOut(BaseModel):
    """One row of the match table (ChainOpera Launch's columns)."""

    provider: str
    instance: str
    vcpus: int
    memory_gib: float
    gpus: str
    region: str
    cost_per_hour: float
    selected: bool
    data: str = Field(
        "-",
        description="what it holds of the job's datasets, models and checkpoints: cached, K/N cached, "
        "fetch; - for a job without data",
    )


class PlacementRejectedOut(BaseModel):
    node: str
    region: str
    reason: str = Field(description="the rejection's kind, e.g. wrong_gpu_type, maintenance, offline")
    message: str


class WorkerPlacementOut(BaseModel):
    """Where one worker would run now (None: it would wait)."""

    index: int
    group: str
    node: str | None
    region: str | None


class PlacementOut(BaseModel):
    """Where the job would run now: the fitting candidates best first (the first is selected), why each
    other one does not fit (closest misses first), and why the job would wait when nothing fits."""

    fits: bool = Field(description="every worker is placed now")
    unplaceable: bool = Field(
        False, description="the fleet as it is could never hold the job (waiting_reason says what would)"
    )
    workers: list[WorkerPlacementOut] = []
    price_per_gpu_hour: float | None = Field(
        None,
        description="what the job pays per GPU-hour where it would be placed now, by that region's rules; "
        "a job that waits gets the price of the region it is placed in when it is",
    )
    waiting_reason: str | None
    pinned_region: str | None
    pinned_by: str | None
    matches: list[MatchRowOut]
    rejected: list[PlacementRejectedOut]
    rejected_total: int
    # GCP region of a match → seconds since its quota was read (None: never): placement works from the
    # cached read (refreshed every 60 s), so the operator sees how old the capacity it offers is
    gcp_quota_age_s: dict[str, float | None] = {}
    warnings: list[str] = Field(
        default_factory=list,
        description="what would fail or wait when the job is created: a dataset, model or checkpoint that "
        "does not exist, failed, or is still downloading",
    )

    @classmethod
    def of(cls, sub: service.Submission) -> PlacementOut:
        first = sub.decision.first
        rejected = first.rejected
        packing = sub.decision.packing
        groups = [w.group for w in sub.plan]
        return cls(
            fits=packing.complete,
            unplaceable=sub.decision.unplaceable,
            workers=[
                WorkerPlacementOut(
                    index=w,
                    group=groups[w] if w < len(groups) else "worker",
                    node=c.name if c is not None else None,
                    region=c.region if c is not None else None,
                )
                for w, c in zip(packing.workers, packing.chosen, strict=True)
            ],
            price_per_gpu_hour=sub.decision.chosen[0].price_per_gpu_hour if sub.decision.chosen else None,
            waiting_reason=sub.decision.reason,
            pinned_region=sub.pinned.region.name if sub.pinned.region is not None else None,
            pinned_by=sub.pinned.because,
            matches=[MatchRowOut(**row.__dict__) for row in match_rows(first)],
            rejected=[
                PlacementRejectedOut(node=c.name, region=c.region, reason=r.value, message=m)
                for c, r, m in rejected[:REJECTED_SHOWN]
            ],
            rejected_total=len(rejected),
            warnings=sub.warnings,
        )


class JobCreatedOut(JobOut):
    placement: PlacementOut


class LogOut(BaseModel):
    job_id: str
    job_state: str
    worker: int
    worker_state: str
    offset: int
    next_offset: int = Field(description="ask again from here for what came after")
    data: str
    complete: bool = Field(description="the whole output is here: nothing more will come")
    metrics_notice: str | None = Field(
        None, description="what became of its metric lines when some were refused or dropped"
    )


def _spec(body: JobIn) -> JobSpec:
    return spec_from_data(body.spec)  # SpecError (422): one line per error, naming the field


@router.get("/schema", responses=documented(422))
def schema() -> dict[str, Any]:
    """The job spec's JSON Schema (docs/job-spec.schema.json)."""
    return JobSpec.model_json_schema()


@router.post("", status_code=201, responses=documented(403, 404))
def create(body: JobIn, session: Db, principal: Principal) -> JobCreatedOut:
    """Create a job: placed on a node now (`starting`) or `waiting` with the reason. Refused, with
    nothing stored, for a bad spec (422) or a GPU type its pinned region lacks."""
    sub = service.create(session, principal, _spec(body), project=body.project)
    assert sub.job is not None
    return JobCreatedOut(**JobOut.of(sub.job).model_dump(), placement=PlacementOut.of(sub))


@router.post("/dry-run", responses=documented(403, 404))
def dry_run(body: JobIn, session: Db, principal: Principal) -> PlacementOut:
    """Where the job would run now and why every other candidate does not fit; stores nothing."""
    out = PlacementOut.of(service.create(session, principal, _spec(body), project=body.project, dry_run=True))
    shown = {m.region for m in out.matches if provider_for(m.provider).supports(Feature.QUOTA)}
    if shown:
        ages = gcp_capacity.cache_age_s(session)
        out.gcp_quota_age_s = {name: ages.get(name) for name in sorted(shown)}
    return out


@router.get("", responses=documented(404))
def list_jobs(
    session: Db, principal: Principal, project: str | None = None, state: str | None = None
) -> Page[JobOut]:
    """The account's jobs, newest first (optionally one project's, or in one state), with each one's
    duration and credits so far."""
    found = service.list_all(session, principal, project=project, state=state)
    cost = job_cost.costs(session, found, datetime.now(UTC))
    return Page(items=[JobOut.of(j).with_cost(cost[j.id]) for j in found])


@router.get("/{ref}")
def show(ref: str, session: Db, principal: Principal) -> JobOut:
    job = service.get(session, principal, ref)
    cost = job_cost.costs(session, [job], datetime.now(UTC))[job.id]
    return JobOut.of(job).with_cost(cost).model_copy(update={"credits": cost.charged})


@router.get("/{ref}/history")
def history(ref: str, session: Db, principal: Principal) -> Page[EventOut]:
    """Every transition of the job and of its workers, oldest first."""
    return Page(items=[EventOut.of(e) for e in service.history(session, principal, ref)])


@router.post("/{ref}/stop", responses=documented(403))
def stop(ref: str, session: Db, principal: Principal) -> JobOut:
    """Stop the job: its nodes send SIGTERM, wait the grace period, then kill."""
    return JobOut.of(service.stop(session, principal, ref))


@router.get("/{ref}/logs")
def logs(
    ref: str,
    session: Db,
    principal: Principal,
    worker: int = Query(0, ge=0, lt=WORKER_NUMBERS),
    offset: int = Query(0, ge=0, lt=INT64_END),
) -> LogOut:
    """One worker's combined stdout/stderr from `offset`, in order."""
    return LogOut(**job_logs.read(session, principal, ref, worker, offset).__dict__)


class MetricPointOut(BaseModel):
    id: int = Field(description="the order points came in; ask again with after=ID")
    worker: int
    name: str
    step: int | None
    value: float
    at: datetime


class WorkerMetricsOut(BaseModel):
    worker: int
    points: int = Field(description="points kept")
    dropped: int = Field(description="points dropped past the job's bound")
    refused: int = Field(description="metric lines refused (not valid JSON, a name or value out of range)")
    last_refusal: str | None
    notice: str | None = Field(description="one line on what was refused or dropped; None: nothing was")


class MetricsOut(BaseModel):
    job_id: str
    job_state: str
    points: list[MetricPointOut]
    next_after: int = Field(description="ask again with after=next_after for what came since")
    bound: int = Field(description="points a job keeps at most; more are counted and dropped")
    workers: list[WorkerMetricsOut]
    complete: bool = Field(description="the job ended and every log was read: nothing more will come")


@router.get("/{ref}/metrics")
def metrics(
    ref: str,
    session: Db,
    principal: Principal,
    after: int = Query(0, ge=0, lt=INT64_END, description="only points after this id"),
    worker: int | None = Query(None, ge=0, lt=WORKER_NUMBERS),
    name: Annotated[list[str], Query(max_length=64)] = [],  # noqa: B006 (FastAPI copies the default)
) -> MetricsOut:
    """The metric points the job's workers printed (`rigbase:metric {…}` lines), in the order they came."""
    page = job_metrics.read(session, principal, ref, after=after, worker=worker, names=name)
    return MetricsOut(
        job_id=page.job_id,
        job_state=page.job_state,
        points=[MetricPointOut(**p.__dict__) for p in page.points],
        next_after=page.next_after,
        bound=page.bound,
        workers=[WorkerMetricsOut(**w.__dict__) for w in page.workers],
        complete=page.complete,
    )


class UsageSampleOut(BaseModel):
    """A stored sample (store/job_models.py WorkerUsageSample), its fields as the minion's WorkerUsage."""

    model_config = ConfigDict(from_attributes=True)

    worker: int
    at: float = Field(description="Unix time of the sample (a period's start once downsampled)")
    resolution_s: int = Field(description="0: a sample as the node took it; else the mean of this period")
    cpu_cores: float
    memory_bytes: int
    disk_bytes: int
    net_rx_bytes: int
    net_tx_bytes: int
    gpus: list[GpuUsage]


class UsageOut(BaseModel):
    job_id: str
    job_state: str
    disk_gb: int = Field(description="each worker's disk quota in GB, which disk_bytes counts against")
    samples: list[UsageSampleOut] = Field(description="oldest first; the newest 5000 after `since`")


@router.get("/{ref}/usage")
def usage(
    ref: str,
    session: Db,
    principal: Principal,
    worker: int | None = Query(None, ge=0, lt=WORKER_NUMBERS),
    since: float = Query(0.0, ge=0, lt=2**40, description="only samples after this Unix time"),
) -> UsageOut:
    """What each worker's container used (CPU, memory, disk, network, GPUs), sampled by its node."""
    page = job_usage.read(session, principal, ref, worker=worker, since=since)
    return UsageOut(
        job_id=page.job_id,
        job_state=page.job_state,
        disk_gb=page.disk_gb,
        samples=[UsageSampleOut.model_validate(r) for r in page.samples],
    )


@node_router.post(LOG_ROUTE, responses={**NODE_ERRORS, **documented(404)})
def post_log(
    node_id: str,
    job_id: str,
    worker: Annotated[int, Path(ge=0, lt=WORKER_NUMBERS)],
    body: LogChunk,
    session: Db,
    credential: NodeCredential,
) -> LogAck:
    """A worker's output from `offset` (idempotent by offset); the answer says how much is held."""
    return job_logs.append(session, node_id, credential, job_id, worker, body)
