"""A job's burst VM preempted, stopped or deleted outside rigbase (the Pub/Sub instance events,
services/jobs/gcp_events.py): its job lost its node. A training job is re-queued once (all its workers back to
waiting: distributed training restarts together), any other job fails; the reason is in the job's history.
The VM goes to deleting (a Spot VM deletes itself; the reconciler's delete then finds nothing) and its node
is removed."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from contracts.jobspec import JobType
from provisioner.domain.states import JOB_DONE, WORKER_ON_NODE, BurstVmState, JobState, WorkerState
from provisioner.services.cloud import gcp_burst
from provisioner.services.common.wakeups import Wake, wake_after_commit
from provisioner.services.jobs import jobs, worker_output
from provisioner.store.gcp_models import GcpBurstVm
from provisioner.store.job_models import Job

REQUEUES_AFTER_PREEMPTION = 1  # a training job is re-queued this many times, then fails


def preempted(session: Session, vm: GcpBurstVm, *, why: str, actor: str) -> None:
    """Google took the VM back (module docstring). The VM goes to deleting (a Spot VM deletes itself; the
    reconciler's delete then finds nothing), its node is removed."""
    vm.preempted_at = datetime.now(UTC)
    gcp_burst.move(session, vm, BurstVmState.DELETING, actor=actor, reason=why)
    gcp_burst.retire_node(session, vm, actor=actor, reason=why)
    job = session.get_one(Job, vm.job_id)
    if JobState(job.state) in JOB_DONE:
        return
    mine = [w for w in job.workers if w.node_id == vm.node_id and WorkerState(w.state) in WORKER_ON_NODE]
    if not mine:
        return
    earlier = session.scalar(
        select(func.count())
        .select_from(GcpBurstVm)
        .where(GcpBurstVm.job_id == job.id, GcpBurstVm.preempted_at.is_not(None), GcpBurstVm.id != vm.id)
    )
    requeue = job.type == JobType.TRAINING.value and (earlier or 0) < REQUEUES_AFTER_PREEMPTION
    if requeue and all(WorkerState(w.state) in (*WORKER_ON_NODE, WorkerState.WAITING) for w in job.workers):
        for worker in job.workers:
            worker.node_id = None
            worker.generation = None
            if WorkerState(worker.state) != WorkerState.WAITING:
                jobs.transition_worker(
                    session, worker, WorkerState.WAITING, actor=actor, reason=f"re-queued: {why}"
                )
        worker_output.start_over(session, job)
        jobs.transition(
            session,
            job,
            JobState.WAITING,
            actor=actor,
            reason=f"{jobs.WAITING_FOR_GPUS}: re-queued once after {why}",
        )
        wake_after_commit(session, Wake.JOBS)
        return
    again = "" if job.type != JobType.TRAINING.value else f" (already re-queued {earlier} time(s))"
    for worker in mine:
        to = WorkerState.STOPPED if worker.stop_requested else WorkerState.FAILED
        jobs.transition_worker(session, worker, to, actor=actor, reason=f"{why}{again}")
    jobs.settle(session, job, actor=actor)
