"""Jobs: create (validate, lock the price, place or wait), list, show, history, stop; what each node must
run and what it reports are services.job_assignments. docs/jobs.md is the operator's view.

A job belongs to a project of the caller's account; every lookup is scoped to that account, so another
account's job answers exactly as a missing one (404). A job runs one container per worker of its groups
(each a JobWorker row with its own node, resources, state and exit code); `domain.worker_placement.pack`
puts them on the ranked candidates of one region: a gang whole or not at all, an independent job what fits
now. The job's state follows its workers' (`settle`): a gang runs when all run and fails with the first
failure's reason (the others are stopped); an independent job runs while any runs and ends with its last
worker; stopped when the operator stops it. Every change is one audit line (kinds `job` and
`job_worker`): `provision job history`.

A regional resource (a datastore of `data.input`/`data.output`, the `reservation`) pins the job to its
region, and so does `region:`; a GPU type that region does not have is refused at create
(domain.placement.refusal_at_create). Only datastores and reservations of the caller's own regions can be
used: data access is not something a public region lends.

Federated jobs (docs/accounts.md "Sharing a project"): a member of an account a project is shared with
creates a job in it. The job's creator account (`jobs.account_id`) is the sharee's; everything placement
and the usage fee decide by account — own regions, datastores, reservations, the usage-fee price, the
credit check for public capacity — is the project owner's, as for the owner's own jobs. Both see the
job: an account sees the jobs it created and every job in the projects it owns."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from contracts.errors import Conflict, InvalidInput, NotFound, RigbaseError, RuleViolation
from contracts.jobs import PEER_PORTS
from contracts.jobspec import DataRole, JobKind, JobSpec, PlannedWorker
from provisioner.domain import worker_placement
from provisioner.domain.placement import (
    Candidate,
    Placement,
    PlacementRequest,
    refusal_at_create,
)
from provisioner.domain.roles import Action, Principal
from provisioner.domain.states import (
    JOB_DONE,
    JOB_LIVE,
    JOB_TRANSITIONS,
    WORKER_DONE,
    WORKER_ON_NODE,
    WORKER_TRANSITIONS,
    DatastoreState,
    JobState,
    ObjectState,
    RegionState,
    ReservationState,
    WorkerState,
)
from provisioner.domain.worker_placement import Packing
from provisioner.services.accounts import accounts, project_keys
from provisioner.services.billing import ledger
from provisioner.services.cloud import gcp_burst
from provisioner.services.common import audit, lifecycle
from provisioner.services.common.errors import flush
from provisioner.services.common.wakeups import Wake, wake_after_commit
from provisioner.services.jobs import job_placement, job_secrets, worker_output
from provisioner.services.jobs.image_warnings import image_warnings
from provisioner.services.objects import data_objects, node_caches
from provisioner.store.account_models import Project
from provisioner.store.data_models import DataObject
from provisioner.store.job_models import Job, JobWorker
from provisioner.store.models import Node, Region, new_id
from provisioner.store.regional_models import Datastore, Reservation

log = logging.getLogger("rigbase.jobs")

KIND = "job"
WORKER_KIND = "job_worker"
WAITING_FOR_GPUS = "Waiting for GPUs"
WAITING_FOR_CPUS = "Waiting for CPUs"


# ------------------------------------------------------------------------------- transitions


def transition(session: Session, job: Job, to: JobState, *, actor: str, reason: str | None = None) -> None:
    """The only way a job's state changes: checked against the table, audited."""
    lifecycle.apply(
        session, job, to, kind=KIND, name=job.name, table=JOB_TRANSITIONS, actor=actor, reason=reason
    )
    now = datetime.now(UTC)
    if to == JobState.RUNNING and job.started_at is None:
        job.started_at = now
    if to in JOB_DONE:
        job.ended_at = now


def transition_worker(
    session: Session, worker: JobWorker, to: WorkerState, *, actor: str, reason: str | None = None
) -> None:
    """A worker's state change, audited under its job's id (one history for the job and its workers)."""
    lifecycle.apply(
        session,
        worker,
        to,
        kind=WORKER_KIND,
        name=f"{worker.job.name} worker {worker.index}",
        table=WORKER_TRANSITIONS,
        actor=actor,
        reason=reason,
        resource_id=worker.job_id or worker.job.id,
    )
    now = datetime.now(UTC)
    if to == WorkerState.RUNNING and worker.started_at is None:
        worker.started_at = now
    elif to == WorkerState.STARTING:
        worker.started_at = None  # a new placement: billed from its own start there
    if to in WORKER_DONE:  # final states (WORKER_TRANSITIONS): set once
        worker.ended_at = now


# ------------------------------------------------------------------------------- lookups


def _visible_to(account_id: str) -> Any:
    """The jobs an account sees: those it created and every job in the projects it owns."""
    owned = select(Project.id).where(Project.account_id == account_id)
    return or_(Job.account_id == account_id, Job.project_id.in_(owned))


def _account_jobs(principal: Principal) -> Any:
    return select(Job).where(_visible_to(principal.account_id))


def get(session: Session, principal: Principal, ref: str) -> Job:
    """A job of the caller's account by id, or by name (the newest job of that name). Another account's
    job raises the same NotFound as a missing one."""
    job = session.scalar(
        _account_jobs(principal)
        .where((Job.id == ref) | (Job.name == ref))
        .order_by((Job.id == ref).desc(), Job.created_at.desc())
        .limit(1)
    )
    if job is None:
        raise NotFound(f"job '{ref}' does not exist: see `provision job list`", code="job_not_found")
    return job


def list_all(
    session: Session, principal: Principal, *, project: str | None = None, state: str | None = None
) -> list[Job]:
    stmt = _account_jobs(principal)
    if project is not None:
        stmt = stmt.where(Job.project_id == accounts.project_for(session, principal, project).id)
    if state is not None:
        try:
            wanted = JobState(state)
        except ValueError:
            known = ", ".join(s.value for s in JobState)
            raise InvalidInput(f"state '{state}' is not a job state: use one of {known}") from None
        stmt = stmt.where(Job.state == wanted)
    return list(session.scalars(stmt.order_by(Job.created_at.desc(), Job.id)))


def history(session: Session, principal: Principal, ref: str) -> list[Any]:
    """The job's transitions and its workers', oldest first."""
    job = get(session, principal, ref)
    events = audit.history(session, KIND, [job.id]) + audit.history(session, WORKER_KIND, [job.id])
    return sorted(events, key=lambda e: e.id)


# ------------------------------------------------------------------------------- regional pinning


@dataclass(frozen=True)
class Pinned:
    """The region a job must run in and the words for why (None: it may run anywhere it is allowed)."""

    region: Region | None
    because: str | None


def _regions_named(session: Session, name: str) -> list[Region]:
    stmt = select(Region).where(
        Region.state != RegionState.REMOVED, (Region.name == name) | (Region.id == name)
    )
    return list(session.scalars(stmt))


def _regional(
    session: Session, account_id: str, model: Any, kind: str, name: str, region_name: str | None
) -> Any:
    """The datastore or reservation called `name` of `account_id`'s regions (in `region_name` when
    given)."""
    removed = DatastoreState.REMOVED if model is Datastore else ReservationState.REMOVED
    stmt = (
        select(model)
        .join(Region, Region.id == model.region_id)
        .where(model.name == name, model.state != removed, Region.account_id == account_id)
    )
    if region_name is not None:
        stmt = stmt.where((Region.name == region_name) | (Region.id == region_name))
    rows = list(session.scalars(stmt))
    if not rows:
        where = f" in region '{region_name}'" if region_name else " in this account's regions"
        raise NotFound(
            f"{kind} '{name}' does not exist{where}: see `provision {kind} list`", code=f"{kind}_not_found"
        )
    if len(rows) > 1:
        regions = ", ".join(sorted(r.region.name for r in rows))
        raise InvalidInput(
            f"{kind} '{name}' exists in regions {regions}: set `region:` in the job spec to choose one",
            code=f"ambiguous_{kind}",
        )
    return rows[0]


def datastores_of(spec: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    data = spec.get("data") or {}
    return [
        (key, data[key])
        for key in ("input", "output")
        if isinstance(data.get(key), Mapping)
        and data[key].get("datastore") is not None  # not a uri, an object
    ]


def pinned_region(session: Session, account_id: str, spec: Mapping[str, Any]) -> Pinned:
    """The region the job's regional resources (or its `region:`) confine it to; all must agree.
    `account_id`: the account of the job's project, whose regional resources it may use."""
    region_name = spec.get("region")
    found: list[tuple[Region, str]] = []
    for key, path in datastores_of(spec):
        ds = _regional(session, account_id, Datastore, "datastore", str(path.get("datastore")), region_name)
        found.append((ds.region, f"data.{key} datastore '{ds.name}'"))
    if spec.get("reservation"):
        rsv = _regional(
            session, account_id, Reservation, "reservation", str(spec["reservation"]), region_name
        )
        if rsv.state == ReservationState.ASSIGNED:
            # the node an operator assigned it to publishes it already: two nodes would answer for it
            raise RuleViolation(
                f"reservation '{rsv.name}' is assigned to node '{rsv.node.name if rsv.node else '?'}' by an "
                f"operator: `provision reservation unassign {rsv.name}` so it moves with the job",
                code="reservation_assigned",
            )
        found.append((rsv.region, f"reservation '{rsv.name}'"))
    regions = {r.id: r for r, _ in found}
    if len(regions) > 1:
        listed = "; ".join(f"{why} is in {r.name}" for r, why in found)
        raise InvalidInput(
            f"the job's regional resources are in different regions ({listed}): use resources of one region",
            code="regions_differ",
        )
    if found:
        return Pinned(found[0][0], found[0][1])
    if region_name:
        usable = [
            r
            for r in _regions_named(session, str(region_name))
            if r.account_id == account_id or r.public_jobs
        ]
        if not usable:
            raise NotFound(
                f"region '{region_name}' does not exist or takes no jobs of this account: see `provision "
                f"region list`",
                code="region_not_found",
            )
        return Pinned(usable[0], None)
    return Pinned(None, None)


# ------------------------------------------------------------------------------- placement


def request_of(
    resources: Mapping[str, Any],
    account_id: str,
    pinned: Pinned,
    *,
    public_credit: bool = True,
    preemptible: bool = False,
) -> PlacementRequest:
    """One worker's request from its resources. `public_credit`: the account's balance is above zero, so
    it may start on public capacity."""
    max_price = resources.get("max_price")
    return PlacementRequest(
        account_id=account_id,
        gpu_types=frozenset(str(t) for t in resources.get("gpu_types") or []),
        gpu_count=int(resources.get("gpu_count") or 0),
        cpu_count=int(resources.get("cpu_count") or 0),
        max_price=float(max_price) if max_price is not None else None,
        region=pinned.region.name if pinned.region is not None else None,
        region_reason=pinned.because,
        public_credit=public_credit,
        preemptible=preemptible,
    )


def requests_of(
    job_spec: JobSpec, account_id: str, pinned: Pinned, *, public_credit: bool = True
) -> list[PlacementRequest]:
    """Each worker's request, in worker order (a group's workers share one)."""
    made: dict[int, PlacementRequest] = {}
    out: list[PlacementRequest] = []
    for worker in job_spec.plan():
        key = id(worker.resources)
        if key not in made:
            made[key] = request_of(
                worker.resources.model_dump(mode="json"),
                account_id,
                pinned,
                public_credit=public_credit,
                preemptible=job_spec.preemptible,
            )
        out.append(made[key])
    return out


def _with_data(requests: list[PlacementRequest], digests: frozenset[str]) -> list[PlacementRequest]:
    """The requests of a job that mounts these objects: placement prefers where they are cached."""
    return [replace(r, data=digests) for r in requests] if digests else requests


@dataclass(frozen=True)
class Decision:
    """Placement of the workers asked: `packing.placed` the (worker, candidate) pairs that go now; `first`
    the first worker's placement (the match table); `reason` why the rest wait (None: none waits);
    `unplaceable` when the fleet as it is could never hold them."""

    first: Placement
    packing: Packing
    reason: str | None
    after: list[Candidate]  # the snapshot with the chosen GPUs/vCPUs taken (unchanged when nothing went)
    unplaceable: bool = False

    @property
    def chosen(self) -> list[Candidate]:
        return [c for _, c in self.packing.placed]


def decide(
    requests: Sequence[PlacementRequest],
    candidates: Sequence[Candidate],
    *,
    workers: Sequence[int] | None = None,
    whole: bool = True,
    region: str | None = None,
) -> Decision:
    """Place the workers (`workers[i]` needs `requests[i]`; default: 0..n-1) at the prices the job's account
    pays (its own regions at the usage fee), in one region (`region`: the one the job runs in already),
    whole or waiting whole for a gang (`whole`). `after`: `candidates` less what they took."""
    numbers = list(workers) if workers is not None else list(range(len(requests)))
    account = requests[0].account_id
    views: dict[PlacementRequest, list[Candidate]] = {}
    for request in requests:
        if request not in views:  # allowed(): GCP burst VMs to 1-GPU workers only, Spot to preemptible jobs
            views[request] = job_placement.priced_for(job_placement.allowed(candidates, request), account)
    packing = worker_placement.pack(numbers, requests, views, whole=whole, region=region)
    first = packing.placements[requests[0]]
    after = job_placement.take_all(
        list(candidates),
        [(cand, request) for request, cand in zip(requests, packing.chosen, strict=True) if cand is not None],
    )
    view = views[requests[0]]
    if packing.complete:
        return Decision(first, packing, None, after)
    never = worker_placement.never_reason(requests, view, whole=whole)
    if never is not None:
        return Decision(first, packing, never, after, unplaceable=True)
    waiting = [r for r, c in zip(requests, packing.chosen, strict=True) if c is None]
    what = WAITING_FOR_GPUS if waiting[0].gpu_count else WAITING_FOR_CPUS
    blocked = packing.placements[waiting[0]]
    placed = len(packing.placed)
    if whole and len(numbers) > 1:
        fit = packing.fit_now
        why = f"{what}: the gang's {len(numbers)} workers wait together ({fit} fit in one region now); "
    elif placed:
        why = f"{what}: {placed} of {len(numbers)} workers placed, the others wait; "
    else:
        why = f"{what}: "
    return Decision(first, packing, why + blocked.summary(), after)


def _locked_price(requests: Sequence[PlacementRequest], decision: Decision) -> float | None:
    """The job's price per GPU-hour when it is placed at once: its first GPU worker's node's, by its
    region's rules (the owner's usage fee, or the public price); each worker keeps its own (JobWorker
    .price_per_gpu_hour). A job that waits gets none until it is placed: the region it lands in decides,
    not one it might have run in (docs/billing.md)."""
    if all(r.gpu_count == 0 for r in requests):
        return 0.0
    for index, cand in decision.packing.placed:
        if requests[index].gpu_count:
            return cand.price_per_gpu_hour
    return None


def _ports_in_use(session: Session, node_ids: set[str]) -> dict[str, set[int]]:
    rows = session.execute(
        select(JobWorker.node_id, JobWorker.port).where(
            JobWorker.node_id.in_(sorted(node_ids)),
            JobWorker.port.is_not(None),
            JobWorker.state.in_([s.value for s in WORKER_ON_NODE]),
        )
    )
    out: dict[str, set[int]] = {}
    for node_id, port in rows:
        out.setdefault(str(node_id), set()).add(int(port or 0))
    return out


def _assign(session: Session, job: Job, placed: Sequence[tuple[int, Candidate]], *, actor: str) -> None:
    """Put the workers `placed` names on their candidates: a new generation, a peer port free on the node
    (PEER_PORTS), the node's GPU type and the price locked there."""
    job.placements += 1
    generation = f"{job.id}.{job.placements}"
    by_index = {w.index: w for w in job.workers}
    used = _ports_in_use(session, {c.id for _, c in placed})
    for index, cand in placed:
        worker = by_index[index]
        taken = used.setdefault(cand.id, set())
        worker.port = next(p for p in PEER_PORTS if p not in taken)
        taken.add(worker.port)
        worker.node_id = cand.id
        worker.generation = generation
        worker.exit_code = None
        worker.gpu_indices = []
        worker.stop_requested = False
        worker.gpu_type = cand.gpu_type if worker.gpu_count else None
        worker.price_per_gpu_hour = cand.price_per_gpu_hour if worker.gpu_count else 0.0
        transition_worker(
            session,
            worker,
            WorkerState.STARTING,
            actor=actor,
            reason=f"placed on node {cand.name} ({cand.region})",
        )
    if job.region_id is None or JobState(job.state) == JobState.WAITING:
        gpu_workers = [(i, c) for i, c in placed if by_index[i].gpu_count] or list(placed)
        first = gpu_workers[0][1]
        node = session.get(Node, placed[0][1].id)
        job.node_id = placed[0][1].id
        job.region_id = node.region_id if node is not None else None
        job.gpu_type = first.gpu_type if by_index[gpu_workers[0][0]].gpu_count else None
        # fixed when the job is placed, from the rules of the region it is placed in (as region_id is)
        job.price_per_gpu_hour = first.price_per_gpu_hour if job.gpu_type else 0.0
    where = ", ".join(sorted({f"{c.name} ({c.region})" for _, c in placed}))
    if JobState(job.state) == JobState.WAITING:
        transition(session, job, JobState.STARTING, actor=actor, reason=f"placed on {where}")
    storage, missing = node_caches.missing_in_region(session, job)
    if missing:  # a central region's workers start once its storage node holds their data
        job.reason = node_caches.caching_reason(storage, missing)


@dataclass(frozen=True)
class Submission:
    """What `create` decided: the stored job (None for a dry run), worker 0's placement and the pin."""

    job: Job | None
    decision: Decision
    pinned: Pinned
    plan: list[PlannedWorker] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # a dry run's: what would fail or wait at start


def create(
    session: Session,
    principal: Principal,
    job_spec: JobSpec,
    *,
    project: str | None = None,
    dry_run: bool = False,
) -> Submission:
    """Store the job placed (`starting`) or `waiting` with the reason, its price locked. Refused, with
    nothing stored: a GPU type its pinned region lacks, a name a live job of the account has, a
    reservation another live job serves. `dry_run`: decide only (the match table), store nothing."""
    principal.require(Action.RUN_JOBS)
    spec = job_spec.model_dump(mode="json")
    proj = accounts.project_for(session, principal, project)
    owner = proj.account_id  # a federated job places, and pays usage, as its project owner's would
    pinned = pinned_region(session, owner, spec)
    requests = requests_of(job_spec, owner, pinned, public_credit=ledger.can_cover(session, owner))
    warnings: list[str] | None = [] if dry_run else None
    objects = _objects_of(session, job_spec, proj.id, warnings)
    requests = _with_data(requests, frozenset(o.digest for o, _ in objects if o.digest))
    candidates = job_placement.snapshot(session)
    for request in dict.fromkeys(requests):
        refusal = refusal_at_create(request, candidates)
        if refusal is not None:
            raise RuleViolation(refusal, code="gpu_type_not_in_region")
    plan = job_spec.plan()  # each worker's packages install first (apt, conda, pip)
    kind = job_spec.job_kind
    decision = decide(requests, candidates, whole=kind == JobKind.GANG)
    if dry_run:
        warnings = [*(warnings or []), *image_warnings(session, job_spec.environment.image, decision.chosen)]
        return Submission(None, decision, pinned, plan, warnings)
    if decision.unplaceable:
        raise RuleViolation(str(decision.reason), code="unplaceable")
    name = str(spec.get("name"))
    live = [s.value for s in JOB_LIVE]
    # a name is unique among the live jobs the creator sees and those of the project (its owner sees them)
    clash = session.scalar(
        select(Job)
        .where(or_(_visible_to(principal.account_id), Job.project_id == proj.id), Job.name == name)
        .where(Job.state.in_(live))
        .limit(1)
    )
    seen = clash is not None and session.scalar(
        select(Job.id).where(Job.id == clash.id, _visible_to(principal.account_id))
    )
    if clash is not None and not seen:
        # another account's job in a shared project: its state and owner stay unsaid
        raise Conflict(
            f"the job name '{name}' is taken in this project: choose another name", code="duplicate_name"
        )
    if clash is not None:
        raise Conflict(
            f"job '{name}' is already {clash.state} in this account: choose another name, or `provision job "
            f"stop {name}` first",
            code="duplicate_name",
        )
    _reservation_free(session, spec, pinned)
    project_keys.check_for_job(session, proj, principal.account_id, job_spec.environment.keys)
    stored, sealed_env = job_secrets.seal(session, spec)
    job = Job(
        id=new_id("job"),
        name=name,
        account_id=principal.account_id,  # the creator: billing_rules.is_federated compares it
        project_id=proj.id,
        type=str(spec.get("type")),
        spec=stored,
        sealed_env=sealed_env,
        pinned_region_id=pinned.region.id if pinned.region is not None else None,
        price_per_gpu_hour=_locked_price(requests, decision),
        placements=0,
        created_by=principal.actor,
    )
    session.add(job)
    transition(session, job, JobState.WAITING, actor=principal.actor, reason=decision.reason or "created")
    objects += _input_of(session, principal, job, job_spec)
    data_objects.link(session, job.id, objects)
    for planned, request in zip(plan, requests, strict=True):
        worker = JobWorker(
            id=new_id("jwk"),
            job_id=job.id,  # set now: its first audit line is written before the flush
            job=job,
            index=planned.index,
            command=planned.command,
            group_name=planned.group,
            group_index=planned.group_index,
            gpu_count=request.gpu_count,
            cpu_count=0 if request.gpu_count else request.cpu_count,
            gpu_indices=[],
            stop_requested=False,
            log_bytes=0,
            log_complete=False,
        )
        session.add(worker)
        transition_worker(session, worker, WorkerState.WAITING, actor=principal.actor, reason="created")
    _start_or_wait(session, job, decision, data=bool(objects), actor=principal.actor)
    return Submission(job, decision, pinned, plan)


def _start_or_wait(session: Session, job: Job, decision: Decision, *, data: bool, actor: str) -> None:
    """A new job's placed workers assigned, unless its data is still downloading (it waits, saying so,
    and the objects reconciler wakes the jobs one when it is ready) or the capacity went meanwhile."""
    data_wait, _ = data_objects.waiting_for(session, job.id, disk_of(job)) if data else (None, None)
    placed = decision.packing.placed
    if data_wait is not None:
        job.reason = data_wait
        flush(session, f"job '{job.name}'")
    elif not placed or not _assign_or_wait(session, job, placed, actor=actor):
        wake_after_commit(session, Wake.JOBS)
    elif not decision.packing.complete:
        job.reason = decision.reason  # an independent job's other workers wait: say why
        wake_after_commit(session, Wake.JOBS)


def _objects_of(
    session: Session, job_spec: JobSpec, project_id: str, warnings: list[str] | None = None
) -> list[tuple[DataObject, str]]:
    """The ready datasets, model and checkpoints the job mounts (services/objects/data_objects.for_job).
    With `warnings` (a dry run) one that is missing or failed is said there, not refused, and one still
    downloading is said too: the job would wait for it."""
    if job_spec.model is not None and job_spec.model.name is None:
        raise InvalidInput(
            "model.source is made into a model by `provision job create -f FILE`: send model.name, the "
            "model it made (or `provision model create NAME --source …` first)",
            code="model_source",
        )
    wanted = [
        (m.role.value, m.name, m.target)
        for m in job_spec.mounts()
        if m.datastore is None and m.role is not DataRole.INPUT  # a uri input is the job's own (_input_of)
    ]
    if warnings is None:
        return data_objects.for_job(session, project_id, wanted)
    found: list[tuple[DataObject, str]] = []
    for mount in wanted:
        try:
            found += data_objects.for_job(session, project_id, [mount])
        except RigbaseError as exc:
            warnings.append(exc.message)
    warnings += [
        f"{o.kind} {o.name!r} is still {o.state}: the job waits until it is ready"
        for o, _ in found
        if o.state != ObjectState.READY
    ]
    return found


def _input_of(
    session: Session, principal: Principal, job: Job, job_spec: JobSpec
) -> list[tuple[DataObject, str]]:
    """An inference job's one-time input (data.input.uri), made for it now; none otherwise."""
    given = job_spec.data.input
    if given is None or given.uri is None:
        return []
    obj = data_objects.input_for(
        session,
        principal,
        job.project_id,
        job.id,
        job.name,
        given.uri,
        key=given.key,
        endpoint_url=given.endpoint_url,
    )
    return [(obj, job_spec.input_path)]


def _assign_or_wait(
    session: Session, job: Job, placed: Sequence[tuple[int, Candidate]], *, actor: str
) -> bool:
    """Assign the workers; GCP candidates first become burst VMs with their nodes (services.gcp_burst).
    False, with the job's reason set, when that capacity was taken since the snapshot: the job waits."""
    made, why = gcp_burst.materialise(session, job, placed, actor=actor)
    if why is not None:
        job.reason = f"{WAITING_FOR_GPUS}: {why}"
        flush(session, f"job '{job.name}'")
        return False
    _assign(session, job, made, actor=actor)
    return True


def _reservation_free(session: Session, spec: Mapping[str, Any], pinned: Pinned) -> None:
    """One live job per reservation: its port and host name can be published by one worker only."""
    wanted = spec.get("reservation")
    if not wanted or pinned.region is None:
        return
    live = [s.value for s in JOB_LIVE]
    for other in session.scalars(
        select(Job).where(Job.pinned_region_id == pinned.region.id, Job.state.in_(live))
    ):
        if other.spec.get("reservation") == wanted:
            raise Conflict(
                f"reservation '{wanted}' is used by job '{other.name}' ({other.state}): stop it first, or "
                "use another reservation",
                code="reservation_in_use",
            )


def waiting_workers(job: Job) -> list[JobWorker]:
    return [w for w in job.workers if WorkerState(w.state) == WorkerState.WAITING]


def place_waiting(
    session: Session, job: Job, *, actor: str, candidates: list[Candidate] | None = None
) -> list[Candidate]:
    """Try to place a job's waiting workers (the reconciler's pass: a waiting job, or an independent one
    whose other workers run) on `candidates` (default: a fresh snapshot of the fleet). Returns the
    snapshot with what the job took, so a pass over many waiting jobs takes one snapshot. A job that
    still waits keeps an up-to-date reason (`Unplaceable: …` when the fleet as it is could never hold it:
    it waits, since nodes may join)."""
    snapshot = job_placement.snapshot(session) if candidates is None else candidates
    waiting = waiting_workers(job)
    if not waiting:
        return snapshot
    if JobState(job.state) == JobState.WAITING and _waits_for_data(session, job, actor=actor):
        return snapshot
    pinned = Pinned(session.get(Region, job.pinned_region_id) if job.pinned_region_id else None, None)
    if pinned.region is not None:
        pinned = Pinned(pinned.region, _pin_words(job.spec))
    owner = job.project.account_id  # as at create: the project owner's placement
    job_spec = JobSpec.model_validate(job.spec)
    every = requests_of(job_spec, owner, pinned, public_credit=ledger.can_cover(session, owner))
    every = _with_data(every, node_caches.digests_of(session, job.id))
    requests = [every[w.index] for w in waiting]
    started = JobState(job.state) != JobState.WAITING
    region = job.region.name if started and job.region is not None else None
    decision = decide(
        requests,
        snapshot,
        workers=[w.index for w in waiting],
        whole=job_spec.job_kind == JobKind.GANG,
        region=region,
    )
    if not decision.packing.placed:
        if decision.reason and decision.reason != job.reason:
            job.reason = decision.reason  # the same state, a fresher why: not a transition
            flush(session, f"job '{job.name}'")
        return snapshot
    if not _assign_or_wait(session, job, decision.packing.placed, actor=actor):
        return snapshot
    if not decision.packing.complete and decision.reason:
        job.reason = decision.reason
    return decision.after


def disk_of(job: Job) -> int:
    """The smallest disk_size of the job's workers, in GB (what an inference input must fit)."""
    return min(w.resources.disk_size for w in JobSpec.model_validate(job.spec).plan())


def _waits_for_data(session: Session, job: Job, *, actor: str) -> bool:
    """A waiting job whose data is still downloading keeps waiting, saying so; one whose data failed (or
    was removed) fails, as a worker that could not start would."""
    data_wait, lost = data_objects.waiting_for(session, job.id, disk_of(job))
    if lost is not None:
        reason = f"its data cannot be had: {lost}"
        _stop_workers(session, job, actor=actor, reason=reason)
        transition(session, job, JobState.FAILED, actor=actor, reason=reason)
        return True
    if data_wait is not None and data_wait != job.reason:
        job.reason = data_wait  # the same state, a fresher why: not a transition
        flush(session, f"job '{job.name}'")
    return data_wait is not None


def _pin_words(spec: Mapping[str, Any]) -> str | None:
    for key, path in datastores_of(spec):
        return f"data.{key} datastore '{path.get('datastore')}'"
    if spec.get("reservation"):
        return f"reservation '{spec['reservation']}'"
    return None


# ------------------------------------------------------------------------------- stop and settle


def stop(session: Session, principal: Principal, ref: str) -> Job:
    """Stop a job: waiting workers stop at once; the node of each placed worker gets `stop: true`
    (SIGTERM, grace period, SIGKILL) and its report ends the worker."""
    principal.require(Action.RUN_JOBS)
    job = get(session, principal, ref)
    if JobState(job.state) in JOB_DONE:
        raise RuleViolation(
            f"job '{job.name}' already ended ({job.state}): nothing to stop", code="job_ended"
        )
    stop_as(session, job, actor=principal.actor, reason=f"stopped by {principal.actor}")
    return job


def stop_as(session: Session, job: Job, *, actor: str, reason: str) -> None:
    """Stop a live job for `actor` (an operator, or a rule such as autostop), with `reason`."""
    _stop_workers(session, job, actor=actor, reason=reason)
    transition(session, job, JobState.STOPPED, actor=actor, reason=reason)


def _stop_workers(session: Session, job: Job, *, actor: str, reason: str) -> None:
    for worker in job.workers:
        state = WorkerState(worker.state)
        if state == WorkerState.WAITING:
            transition_worker(session, worker, WorkerState.STOPPED, actor=actor, reason=reason)
        elif state in WORKER_ON_NODE:
            worker.stop_requested = True


def settle(session: Session, job: Job, *, actor: str) -> None:
    """Move the job to what its workers say (module docstring); a finished worker frees capacity.

    A gang fails whole: its first failed worker stops the others. An independent job's failed worker
    fails only itself; the job ends when its last worker does (succeeded when every one exited 0, else
    failed naming those that did not), and runs while any of its workers runs."""
    if JobState(job.state) in JOB_DONE:
        return
    states = [WorkerState(w.state) for w in job.workers]
    failed = [w for w in job.workers if WorkerState(w.state) in (WorkerState.FAILED, WorkerState.STOPPED)]
    gang = JobSpec.model_validate(job.spec).job_kind == JobKind.GANG
    if failed and gang:
        why = f"worker {failed[0].index}: {failed[0].reason or failed[0].state}"
        _stop_workers(session, job, actor=actor, reason=f"stopped: {why}")
        transition(session, job, JobState.FAILED, actor=actor, reason=why)
    elif all(s == WorkerState.SUCCEEDED for s in states):
        transition(session, job, JobState.SUCCEEDED, actor=actor, reason="every worker exited with code 0")
    elif all(s in WORKER_DONE for s in states):
        listed = "; ".join(f"worker {w.index}: {w.reason or w.state}" for w in failed[:5])
        more = f" (and {len(failed) - 5} more)" if len(failed) > 5 else ""
        why = f"{len(failed)} of {len(states)} workers failed: {listed}{more}"
        transition(session, job, JobState.FAILED, actor=actor, reason=why)
    elif job.state == JobState.STARTING and (
        all(s in (WorkerState.RUNNING, WorkerState.SUCCEEDED) for s in states)
        or (not gang and WorkerState.RUNNING in states)
    ):
        reason = (
            "every worker runs"
            if gang or WorkerState.WAITING not in states
            else (f"{states.count(WorkerState.RUNNING)} of {len(states)} workers run, the others wait")
        )
        transition(session, job, JobState.RUNNING, actor=actor, reason=reason)


def requeue_or_fail(session: Session, job: Job, node: Node, *, why: str, actor: str) -> None:
    """`node` is lost (offline or errored past the grace period). A gang none of whose workers started goes
    back to waiting whole (new generation at its next placement; its partial logs dropped); an
    independent job's workers there that never ran go back to waiting alone. Every other worker there
    fails with `why` (stopped ones, of a job already stopped, end stopped)."""
    mine = [w for w in job.workers if w.node_id == node.id and WorkerState(w.state) in WORKER_ON_NODE]
    if not mine:
        return
    gang = JobSpec.model_validate(job.spec).job_kind == JobKind.GANG
    never_ran = (
        job.state == JobState.STARTING
        and job.started_at is None
        and all(WorkerState(w.state) in (WorkerState.STARTING, WorkerState.WAITING) for w in job.workers)
    )
    if gang and never_ran:
        for worker in job.workers:
            _requeue_worker(session, worker, why=why, actor=actor)
        worker_output.start_over(session, job)
        transition(session, job, JobState.WAITING, actor=actor, reason=_requeued(job, why))
        wake_after_commit(session, Wake.JOBS)
        return
    for worker in mine:
        if not gang and WorkerState(worker.state) == WorkerState.STARTING and not worker.stop_requested:
            _requeue_worker(session, worker, why=why, actor=actor)
            wake_after_commit(session, Wake.JOBS)
            continue
        to = WorkerState.STOPPED if worker.stop_requested else WorkerState.FAILED
        transition_worker(session, worker, to, actor=actor, reason=why)
    if not gang and all(WorkerState(w.state) == WorkerState.WAITING for w in job.workers):
        worker_output.start_over(session, job)
        transition(session, job, JobState.WAITING, actor=actor, reason=_requeued(job, why))
        return
    settle(session, job, actor=actor)


def _requeue_worker(session: Session, worker: JobWorker, *, why: str, actor: str) -> None:
    worker.node_id = None
    worker.generation = None
    worker.port = None
    transition_worker(session, worker, WorkerState.WAITING, actor=actor, reason=f"re-queued: {why}")


def _requeued(job: Job, why: str) -> str:
    return f"{WAITING_FOR_GPUS if _gpu_job(job) else WAITING_FOR_CPUS}: re-queued, {why}"


def _gpu_job(job: Job) -> bool:
    return any(w.gpu_count for w in job.workers)
