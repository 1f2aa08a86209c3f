"""Jobs on the nodes: what each node must run (contributor `jobs`: its WorkerAssignments, contracts/jobs.py)
and what it reports it runs (reporter `jobs`: WorkerReports → worker states and exit codes → the job's state,
services.jobs.settle). Both travel in the heartbeat (no inbound connection to a node).

A worker stays in its node's desired state while it should run or stop, and after it ended until the node
has shipped all of its output (the minion forgets a worker the desired state stops listing, and with it
the rest of its log: docs/minion-jobs.md). A node in maintenance keeps its running workers: maintenance
takes no NEW jobs (placement rejects the node) and lets running ones finish."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import ValidationError
from sqlalchemy import and_, bindparam, exists, or_, select
from sqlalchemy.orm import Session, lazyload

from contracts.jobs import (
    DatastoreAccess,
    JobNetwork,
    JobsActual,
    JobsDesired,
    Mount,
    MountSource,
    ReservationBinding,
    UserNamespace,
    WorkerAssignment,
    WorkerReport,
    WorkerRunState,
)
from contracts.jobspec import JobKind, JobSpec, JobType
from contracts.regional import StorageMode
from provisioner.domain import served_jobs
from provisioner.domain.states import (
    NODE_READY,
    WORKER_DONE,
    WORKER_ON_NODE,
    DatastoreState,
    JobState,
    NodeState,
    ReservationState,
    WorkerState,
)
from provisioner.services.accounts import project_keys
from provisioner.services.common import desired_state
from provisioner.services.common.errors import flush
from provisioner.services.common.runtime import runtime_of
from provisioner.services.common.wakeups import Wake, wake_after_commit
from provisioner.services.jobs import job_autostop, job_peers, job_secrets, job_urls, job_usage, jobs
from provisioner.services.objects import data_objects, node_caches
from provisioner.store.account_models import Account
from provisioner.store.expressions import one_of
from provisioner.store.job_models import Job, JobWorker
from provisioner.store.models import Node
from provisioner.store.regional_models import Datastore, Reservation

log = logging.getLogger("rigbase.jobs")

STOP_GRACE_S = 30  # SIGTERM, this long, then SIGKILL (contracts.jobs.WorkerAssignment.stop_grace_s)
# a worker without numbers from the node's inventory (a lab node reports little) gets this much
DEFAULT_CPUS = 1.0
DEFAULT_MEMORY_MB = 1024
# how long an ended worker stays in its node's desired state while its output is still being shipped
LOG_TAIL_WINDOW = timedelta(hours=1)
DATASETS_DIR = "/datasets"  # where the region cache keeps datasets (docs/jobs.md "What a worker gets")


def _known_to_node(node_id: Any, *shipping_since: Any) -> Any:
    """The workers node `node_id` must know (see _workers_on); without `shipping_since`, those that ended
    at any time and have not shipped their output."""
    return and_(
        JobWorker.node_id == node_id,
        or_(
            one_of(JobWorker.state, [s.value for s in WORKER_ON_NODE]),
            and_(
                one_of(JobWorker.state, [s.value for s in WORKER_DONE]),
                JobWorker.log_complete.is_(False),
                *shipping_since,
            ),
        ),
    )


# Built once with bound parameters (asked on every heartbeat: building the statement cost more than running
# it); the worker's node is the beating node, already in the session, so it is not joined again.
_WORKERS_ON = (
    select(JobWorker)
    .where(_known_to_node(bindparam("node_id"), JobWorker.ended_at > bindparam("shipping_since")))
    .order_by(JobWorker.job_id, JobWorker.index)
    .options(lazyload("*"))
)
WORKERS_READ = "jobs.workers"


def could_know_workers(node_id: Any) -> Any:
    """Whether the node has any worker `_WORKERS_ON` would find (`node_id`: a column it correlates to)."""
    return exists().where(_known_to_node(node_id))


def _workers_on(session: Session, node: Node) -> list[JobWorker]:
    """The workers this node must know: those placed there that run (or should stop), and those that ended
    there whose output the node has not finished shipping (the minion forgets a worker the desired state
    stops listing, and with it the rest of its log: docs/minion-jobs.md), for at most LOG_TAIL_WINDOW.
    None without a read when the beat's first query found the node has none."""
    if desired_state.nothing_to_read(session, WORKERS_READ):
        return []
    since = datetime.now(UTC) - LOG_TAIL_WINDOW
    return list(session.scalars(_WORKERS_ON, {"node_id": node.id, "shipping_since": since}))


def _share(node: Node, worker: JobWorker) -> tuple[float, int]:
    """CPUs and memory (MB) for one worker: a CPU-only worker's cpu_count (and that share of the memory);
    a GPU worker the node's CPUs and memory in proportion to the GPUs it takes."""
    inventory = node.inventory or {}
    cpu = inventory.get("cpu") if isinstance(inventory.get("cpu"), Mapping) else {}
    threads = int((cpu or {}).get("threads") or 0)
    memory_mb = int(inventory.get("memory_total_bytes") or 0) // 2**20
    gpus_total = len(inventory.get("gpus") or [])
    gpu_count = worker.gpu_count
    if gpu_count and gpus_total:
        fraction = gpu_count / gpus_total
    elif not gpu_count and threads and worker.cpu_count:
        fraction = worker.cpu_count / threads
    else:
        fraction = 0.0
    cpus = round(threads * fraction, 2) if threads and fraction else DEFAULT_CPUS
    memory = int(memory_mb * fraction) if memory_mb and fraction else DEFAULT_MEMORY_MB
    return max(cpus, 0.01), max(memory, 16)


def _mounts(session: Session, job: Job, job_spec: JobSpec) -> list[Mount]:
    """The spec's data mounts (contracts.jobspec.Data.mounts) on the node: a dataset, model or checkpoint
    as the object the job was created with (the node fetches it by digest), input and output from their
    datastores. A job created before objects existed mounts its datasets from the region cache
    (CACHE/datasets/NAME, read-only)."""
    wanted = job_spec.mounts()
    # read only for a job that mounts objects: most beats carry jobs that mount none
    objects = data_objects.mounted_by(session, job.id) if any(m.datastore is None for m in wanted) else {}
    out: list[Mount] = []
    for m in wanted:
        obj = objects.get(m.target) if m.datastore is None else None
        if obj is not None:
            source = Mount(
                source_kind=MountSource.OBJECT,
                object_id=obj.id,
                digest=obj.digest,
                name=obj.name,
                target=m.target,
                read_only=True,
            )
        elif m.datastore is None:
            source = Mount(
                source_kind=MountSource.CACHE,
                path=f"{DATASETS_DIR}/{m.name}",
                target=m.target,
                read_only=True,
            )
        else:
            source = Mount(
                source_kind=MountSource.DATASTORE,
                datastore=m.datastore,
                path=m.path,
                target=m.target,
                read_only=m.read_only,
            )
        out.append(source)
    return out


def _env(
    session: Session, job: Job, worker: JobWorker, kind: JobKind, memory_mb: int, *, with_secrets: bool
) -> dict[str, str]:
    """The spec's variables (its secret ones `with_secrets` only) plus the worker's rank, group and peers
    (services.job_peers; the minion adds RIGBASE_JOB_NAME, _JOB_ID, _WORKER and the data paths itself:
    minion/jobs/container.py)."""
    env = job_secrets.environment(session, job, with_secrets=with_secrets)
    env.update(job_peers.environment(job, worker, kind, memory_mb))
    return env


def needs_secrets(node: Node, worker: JobWorker) -> bool:
    """A worker's secrets (datastore passwords, secret environment values) go only with an assignment that
    is starting or running (not one being stopped, nor one listed only to ship its log) on a node in good
    standing (not errored)."""
    return (
        NodeState(node.state) in NODE_READY
        and WorkerState(worker.state) in WORKER_ON_NODE
        and not worker.stop_requested
    )


def _userns(session: Session, job: Job) -> UserNamespace:
    account = session.get(Account, job.account_id)
    assert account is not None  # a foreign key
    return UserNamespace.of_slot(account.uid_slot)


def assignment_of(session: Session, node: Node, worker: JobWorker) -> WorkerAssignment:
    job = worker.job
    cpus, memory_mb = _share(node, worker)
    job_spec = JobSpec.model_validate(job.spec)
    kind = job_spec.job_kind
    resources = job_spec.plan()[worker.index].resources
    reservation = None
    if job.spec.get("reservation") and job.pinned_region_id:
        rsv = session.scalar(
            select(Reservation).where(
                Reservation.region_id == job.pinned_region_id,
                Reservation.name == str(job.spec["reservation"]),
                Reservation.state != ReservationState.REMOVED,
            )
        )
        if rsv is not None:
            reservation = ReservationBinding(port=rsv.port, hostname=rsv.hostname, protocol=rsv.protocol)
    image = str((job.spec.get("environment") or {}).get("image"))
    secrets = needs_secrets(node, worker)
    env = _env(session, job, worker, kind, memory_mb, with_secrets=secrets)
    command = worker.command
    serve = served_jobs.serve_binding(job_spec, job.id) if worker.index == 0 else None
    if job_spec.type is JobType.NOTEBOOK:
        command = served_jobs.notebook_command(job.id, worker.command)
        if secrets:
            env[served_jobs.NOTEBOOK_TOKEN_VARIABLE] = job_urls.token_of(session, job.id)
    return WorkerAssignment(
        job_id=job.id,
        job_name=job.name,
        worker=worker.index,
        generation=worker.generation or f"{job.id}.{job.placements}",
        image=image,
        command=command,
        env=env,
        gpu_count=worker.gpu_count,
        cpus=cpus,
        memory_mb=memory_mb,
        # an inference input is the worker's own data: it counts against its disk, left for its writes
        disk_gb=max(1, resources.disk_size - math.ceil(_input_bytes(session, job_spec, job.id) / 10**9)),
        mounts=_mounts(session, job, job_spec),
        reservation=reservation if worker.index == 0 else None,  # one worker serves the endpoint
        serve=serve,
        port=worker.port,
        peers=job_peers.peers_of(job, worker) if kind == JobKind.GANG else [],
        userns=_userns(session, job),
        registry_auth=project_keys.registry_auth(session, job, image) if secrets else None,
        # an ended worker listed only for its log: stop, never run again
        stop=worker.stop_requested or WorkerState(worker.state) in WORKER_DONE,
        stop_grace_s=STOP_GRACE_S,
    )


def _input_bytes(session: Session, job_spec: JobSpec, job_id: str) -> int:
    given = job_spec.data.input
    return data_objects.input_bytes(session, job_id) if given is not None and given.uri else 0


def _may_start(session: Session, worker: JobWorker) -> bool:
    """A gang's worker is sent once every peer has a node with an address (it starts with all of them
    known), and in a central region once the region's storage node holds the job's data (the node reads
    it from there); one to stop, or listed for its log, is always sent."""
    if worker.stop_requested or WorkerState(worker.state) != WorkerState.STARTING:
        return True
    job = worker.job
    if job.region is not None and job.region.storage_mode == StorageMode.CENTRAL.value:
        _, missing = node_caches.missing_in_region(session, job)
        if missing:
            return False
    if len(job.workers) == 1 or JobSpec.model_validate(job.spec).job_kind != JobKind.GANG:
        return True
    return job_peers.peers_ready(job)


def datastore_access(session: Session, region_id: str, names: set[str]) -> list[DatastoreAccess]:
    """The live datastores of `names` in the region, with their unsealed passwords (a job's or a device's)."""
    if not names:
        return []
    sealer = runtime_of(session).sealer
    rows = session.scalars(
        select(Datastore).where(
            Datastore.region_id == region_id,
            Datastore.name.in_(sorted(names)),
            Datastore.state != DatastoreState.REMOVED,
        )
    )
    return [
        DatastoreAccess(
            name=ds.name,
            type=ds.type,
            address=ds.address,
            root=ds.root,
            username=ds.username,
            password=sealer.unseal(ds.sealed_password).decode() if ds.sealed_password else None,
        )
        for ds in rows
    ]


def desired_for_node(session: Session, node: Node) -> dict[str, Any]:
    """Every worker placed on this node (stop: true for the ones to stop) and the datastores of those that
    need them (needs_secrets). A node in maintenance keeps its running workers: maintenance takes no NEW
    jobs and lets running ones finish."""
    workers: list[WorkerAssignment] = []
    datastores: set[str] = set()
    for worker in _workers_on(session, node):
        if not _may_start(session, worker):
            continue
        try:
            assignment = assignment_of(session, node, worker)
        except ValidationError as exc:  # a spec the wire refuses must not take the node's other jobs down
            log.warning(
                "job %s worker %s cannot be sent to node %s: %s", worker.job_id, worker.index, node.name, exc
            )
            continue
        workers.append(assignment)
        if needs_secrets(node, worker):
            datastores |= {m.datastore for m in assignment.mounts if m.datastore is not None}
    return JobsDesired(
        workers=workers,
        datastores=datastore_access(session, node.region_id, datastores),
        network=JobNetwork(lan=node.region.jobs_lan),
    ).model_dump(mode="json")


def _apply_report(session: Session, node: Node, worker: JobWorker, report: WorkerReport, actor: str) -> None:  # noqa: C901
    worker.reported_at = datetime.now(UTC)
    if report.gpu_indices:
        worker.gpu_indices = list(report.gpu_indices)
    if report.log_eof and report.log_acked == worker.log_bytes:
        worker.log_complete = True  # everything it wrote is here (also when its eof chunk was lost)
    state = WorkerState(worker.state)
    if state not in WORKER_ON_NODE:
        return
    if report.state == WorkerRunState.RUNNING and state == WorkerState.STARTING:
        jobs.transition_worker(
            session, worker, WorkerState.RUNNING, actor=actor, reason=f"running on {node.name}"
        )
    elif report.state == WorkerRunState.STARTING and report.message and state == WorkerState.STARTING:
        _starting_note(worker, report.message)
    elif report.state in (WorkerRunState.EXITED, WorkerRunState.STOPPED):
        worker.exit_code = report.exit_code
        code = report.exit_code
        if worker.stop_requested:
            jobs.transition_worker(
                session, worker, WorkerState.STOPPED, actor=actor, reason=f"stopped (exit code {code})"
            )
        elif report.state == WorkerRunState.EXITED and code == 0:
            jobs.transition_worker(
                session, worker, WorkerState.SUCCEEDED, actor=actor, reason="exited with code 0"
            )
        elif report.state == WorkerRunState.EXITED:
            why = f"exited with code {code}" + (f": {report.message}" if report.message else "")
            jobs.transition_worker(session, worker, WorkerState.FAILED, actor=actor, reason=why)
        else:
            why = f"stopped on node {node.name}" + (f": {report.message}" if report.message else "")
            jobs.transition_worker(session, worker, WorkerState.FAILED, actor=actor, reason=why)
    elif report.state == WorkerRunState.FAILED_TO_START:
        why = "failed to start" + (f": {report.message}" if report.message else "")
        to = WorkerState.STOPPED if worker.stop_requested else WorkerState.FAILED
        jobs.transition_worker(session, worker, to, actor=actor, reason=why)
    if WorkerState(worker.state) in WORKER_DONE:
        _ran_between_beats(worker, report)
        wake_after_commit(session, Wake.JOBS)  # capacity freed: a waiting job may fit now


def _starting_note(worker: JobWorker, message: str) -> None:
    """What a starting worker's node says it waits for (its data, its server's first answer) becomes the
    worker's reason and, while the job starts, the job's; written only when it changes."""
    if worker.reason == message:
        return
    worker.reason = message
    job = worker.job
    if JobState(job.state) is JobState.STARTING:
        job.reason = message if len(job.workers) == 1 else f"worker {worker.index}: {message}"


def _ran_between_beats(worker: JobWorker, report: WorkerReport) -> None:
    """A worker that began and ended between two beats was never seen running: its start is its end (the
    control plane's time) less how long its node says the container ran, never before its job was created.
    One seen running keeps the start the control plane saw."""
    if worker.started_at is not None or worker.ended_at is None or report.ran_s is None:
        return
    earliest = worker.job.created_at
    start = worker.ended_at - timedelta(seconds=report.ran_s)
    worker.started_at = max(start, earliest) if earliest is not None else start


def record_actual(session: Session, node: Node, reported: Any) -> None:
    """Each WorkerReport moves its worker (reports of another node or generation are ignored), then the
    job follows its workers. A report the contract refuses is ignored as a whole, logged."""
    try:
        actual = JobsActual.model_validate(reported)
    except ValidationError as exc:
        log.warning("node %s sent a jobs report the contract refuses: %s", node.name, exc.errors()[:3])
        return
    if actual.images is not None:
        images = actual.images.model_dump(mode="json")
        if node.images != images:  # a steady beat writes nothing more
            node.images = images
    mine = {(w.job_id, w.index): w for w in _workers_on(session, node)}
    actor = f"minion:{node.minion_id}"
    now = datetime.now(UTC)
    touched: dict[str, Job] = {}
    for report in actual.workers:
        worker = mine.get((report.job_id, report.worker))
        if worker is None or worker.generation != report.generation:
            continue
        _apply_report(session, node, worker, report, actor)
        job_usage.record(session, worker, report.usage)
        job_autostop.record(session, worker, report, now)
        touched[worker.job_id] = worker.job
    for job in touched.values():
        jobs.settle(session, job, actor=actor)
    flush(session, f"the jobs of node '{node.name}'")
