"""Reconciler: jobs follow the fleet.

Each pass (every 10 s, and at once when a job is created waiting or a worker ends):
1. the workers of a lost node — offline past the online window, or errored or removed — fail once it has
   been lost for the settings' `job_node_grace_s` (RIGBASE_JOB_NODE_GRACE_S, 5 min); a job none of whose
   workers started yet is re-queued instead (services.jobs.requeue_or_fail). A node in maintenance is not
   lost: it lets its running workers finish and takes no new ones (placement rejects it).
2. waiting jobs, oldest first, are placed on what is free now; one that still waits keeps a fresh reason.
3. workers' usage samples older than an hour are folded into 5-minute means (services/jobs/job_usage.py).
Stateless: the store says what is behind, so a restarted control plane picks up where it was."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from sqlalchemy import and_, exists, or_, select
from sqlalchemy.orm import Session, sessionmaker

from provisioner.domain.placement import Candidate
from provisioner.domain.states import (
    JOB_LIVE,
    JOB_ON_NODE,
    NODE_STOPPED,
    ONLINE_WINDOW,
    WORKER_ON_NODE,
    JobState,
    WorkerState,
)
from provisioner.reconcilers.loop import register
from provisioner.services.common import audit
from provisioner.services.common.runtime import runtime_of
from provisioner.services.common.wakeups import Wake
from provisioner.services.fleet import nodes as node_service
from provisioner.services.jobs import job_usage, jobs
from provisioner.store.engine import session_scope
from provisioner.store.job_models import Job, JobWorker
from provisioner.store.models import Node

log = logging.getLogger("rigbase.reconcilers.jobs")
ACTOR = "reconciler:jobs"


@register(Wake.JOBS, period_s=10.0)
def reconcile(sessions: sessionmaker[Session]) -> None:
    grace = timedelta(seconds=runtime_of(sessions).settings.job_node_grace_s)
    now = datetime.now(UTC)
    fail_lost_nodes(sessions, grace=grace, now=now)
    place_waiting(sessions)
    with session_scope(sessions) as session:
        job_usage.compact(session)


def lost_because(session: Session, node: Node, *, grace: timedelta, now: datetime) -> str | None:
    """Why `node` counts as lost for its jobs (None: it is not, or not for long enough yet)."""
    if node.state in NODE_STOPPED:
        events = audit.history(session, node_service.KIND, [node.id])
        since = events[-1].at if events else node.updated_at
        if now - since >= grace:
            detail = f": {node.reason}" if node.reason else ""
            return f"node {node.name} is {node.state}{detail}"
        return None
    # a node that never reported yet (a GCP burst VM booting for its job) counts from when it was made
    seen = node.last_heartbeat_at or node.created_at
    if seen is None or now - seen >= ONLINE_WINDOW + grace:
        last = node.last_heartbeat_at
        when = last.isoformat(timespec="seconds") if last else "never"
        return f"node {node.name} went offline (last heartbeat {when})"
    return None


def fail_lost_nodes(sessions: sessionmaker[Session], *, grace: timedelta, now: datetime) -> None:
    on_node = [s.value for s in WORKER_ON_NODE]
    with session_scope(sessions) as session:
        node_ids: list[str] = sorted(
            {
                node_id
                for node_id in session.scalars(select(JobWorker.node_id).where(JobWorker.state.in_(on_node)))
                if node_id is not None
            }
        )
    for node_id in node_ids:
        try:
            with session_scope(sessions) as session:
                node = session.get(Node, node_id)
                if node is None:
                    continue
                why = lost_because(session, node, grace=grace, now=now)
                if why is None:
                    continue
                job_ids = set(
                    session.scalars(
                        select(JobWorker.job_id).where(
                            JobWorker.node_id == node.id, JobWorker.state.in_(on_node)
                        )
                    )
                )
                for job_id in sorted(job_ids):
                    job = session.get(Job, job_id)
                    if job is not None:
                        jobs.requeue_or_fail(session, job, node, why=why, actor=ACTOR)
        except Exception:
            log.exception("lost-node check of node %s failed; retrying next pass", node_id)


def place_waiting(sessions: sessionmaker[Session]) -> None:
    with session_scope(sessions) as session:
        # a waiting job, or an independent one whose other workers run while these wait
        some_wait = exists().where(JobWorker.job_id == Job.id, JobWorker.state == WorkerState.WAITING.value)
        waiting = list(
            session.scalars(
                select(Job.id)
                .where(
                    or_(
                        Job.state == JobState.WAITING,
                        and_(Job.state.in_([s.value for s in JOB_ON_NODE]), some_wait),
                    )
                )
                .order_by(Job.created_at, Job.id)
            )
        )
    snapshot: list[Candidate] | None = None  # one fleet snapshot per pass, less what each placed job took
    for job_id in waiting:
        try:
            with session_scope(sessions) as session:
                job = session.get(Job, job_id)
                if job is not None and JobState(job.state) in JOB_LIVE:
                    snapshot = jobs.place_waiting(session, job, actor=ACTOR, candidates=snapshot)
        except Exception:
            snapshot = None  # what that job took is unknown: the next one looks again
            log.exception("placing job %s failed; retrying next pass", job_id)
