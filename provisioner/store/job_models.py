"""Store models of jobs: the job (its spec, project, locked price and placement), one row per
worker (a container on a node, with its own state and exit code) and the worker's log, stored as the
chunks the minion ships (idempotent by byte offset, so a resend after a restart of either side adds
nothing twice), and the metric points read from that log. A job's history is the audit trail (kinds `job`
and `job_worker`), like every resource."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column, relationship

from provisioner.store.account_models import Project
from provisioner.store.models import Base, Node, Region, UTCDateTime, new_id, utcnow


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (Index("ix_jobs_account_name", "account_id", "name"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: new_id("job"))
    name: Mapped[str] = mapped_column(String(63))
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), index=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"), index=True)
    type: Mapped[str] = mapped_column(String(16))
    # the rigbase spec (contracts.jobspec.JobSpec) as JSON, whatever format it was submitted in
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    # the ONE lifecycle field (domain.states.JobState); change it only via services.jobs.transition
    state: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str | None] = mapped_column(Text)
    # credits per GPU-hour, fixed at each placement from the region placed in (job_placement.price_of);
    # None while it waits to be placed
    price_per_gpu_hour: Mapped[float | None] = mapped_column(Float)
    # the spec's secret environment values, sealed (services/jobs/job_secrets.py); the spec keeps names only
    sealed_env: Mapped[str | None] = mapped_column(Text)
    # a regional resource (datastore, reservation) or `region:` pins the job to this region
    pinned_region_id: Mapped[str | None] = mapped_column(ForeignKey("regions.id"))
    # where it runs: worker 0's node and its region (each worker row names its own node)
    region_id: Mapped[str | None] = mapped_column(ForeignKey("regions.id"), index=True)
    node_id: Mapped[str | None] = mapped_column(ForeignKey("nodes.id"), index=True)
    gpu_type: Mapped[str | None] = mapped_column(String(64))
    # counts placements: a re-queued job gets new worker generations, so a late report of the old
    # node can never move the new run
    placements: Mapped[int] = mapped_column(Integer, default=0)
    created_by: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    version: Mapped[int] = mapped_column(Integer, nullable=False)

    project: Mapped[Project] = relationship(lazy="joined")
    region: Mapped[Region | None] = relationship(foreign_keys=[region_id], lazy="joined")
    node: Mapped[Node | None] = relationship(lazy="joined")
    workers: Mapped[list[JobWorker]] = relationship(
        back_populates="job", order_by="JobWorker.index", lazy="selectin"
    )
    __mapper_args__ = {"version_id_col": version}


class JobWorker(Base):
    __tablename__ = "job_workers"
    __table_args__ = (Index("uq_job_workers_job_index", "job_id", "index", unique=True),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: new_id("jwk"))
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"))
    index: Mapped[int] = mapped_column(Integer)
    command: Mapped[str] = mapped_column(Text)
    # its group (contracts.jobspec.WorkerGroup; "worker" for the `workers:` form), its place in it, and
    # what it holds on its node (the group's resources: placement and the usage sums read them here)
    group_name: Mapped[str] = mapped_column(String(63), default="worker", server_default="worker")
    group_index: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    gpu_count: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    cpu_count: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # the port its peers reach it on (RIGBASE_PORT), unique on its node among the live workers
    port: Mapped[int | None] = mapped_column(Integer)
    # where it was placed: its GPU type and the price per GPU-hour locked then (it is billed at this)
    gpu_type: Mapped[str | None] = mapped_column(String(64))
    price_per_gpu_hour: Mapped[float | None] = mapped_column(Float)
    node_id: Mapped[str | None] = mapped_column(ForeignKey("nodes.id"), index=True)
    # domain.states.WorkerState; change it only via services.jobs.transition_worker
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    gpu_indices: Mapped[list[int]] = mapped_column(JSON, default=list)
    # "<job id>.<placement>": reports of another generation are ignored
    generation: Mapped[str | None] = mapped_column(String(48))
    # the stop asked of this worker's container (the minion gets `stop: true` until it reports it ended)
    stop_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    # bytes of its log stored without a gap (the ack the minion resumes from), and whether it ended
    log_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    log_complete: Mapped[bool] = mapped_column(Boolean, default=False)
    # metric lines of its log (contracts/metrics.py): read up to this byte (a line's start), how many
    # points are kept, dropped past the job's bound, refused (and the last refusal's reason)
    metrics_scanned: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    metric_points: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    metrics_dropped: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    metrics_refused: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    metrics_refusal: Mapped[str | None] = mapped_column(Text)
    # the newest usage sample kept (its Unix time): a report's older samples are already here
    usage_at: Mapped[float | None] = mapped_column(Float)
    reported_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # a notebook's or endpoint's server: idle since then, as its node last reported (services.job_autostop)
    idle_since: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # when it began to run, as the control plane measured it (services.jobs: its running report, or the
    # run time its node reported for a worker that ended between two beats): billing starts here
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # when the control plane recorded its end (services.jobs.transition_worker): the log-shipping window
    # runs from here, whatever the node reports afterwards
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
    version: Mapped[int] = mapped_column(Integer, nullable=False)

    job: Mapped[Job] = relationship(back_populates="workers")
    node: Mapped[Node | None] = relationship(lazy="joined")
    __mapper_args__ = {"version_id_col": version}


class JobLogChunk(Base):
    """A piece of one worker's combined stdout/stderr at byte `offset`; (job, worker, offset) is unique."""

    __tablename__ = "job_log_chunks"
    __table_args__ = (Index("uq_job_log_chunks_offset", "job_id", "worker", "offset", unique=True),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"))
    worker: Mapped[int] = mapped_column(Integer)
    offset: Mapped[int] = mapped_column(BigInteger)
    size: Mapped[int] = mapped_column(Integer)  # bytes of `data` in UTF-8
    data: Mapped[str] = mapped_column(Text)
    at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class JobMetric(Base):
    """One metric point a worker printed (contracts/metrics.py); `id` orders a job's points as they came."""

    __tablename__ = "job_metrics"
    __table_args__ = (Index("ix_job_metrics_job_id_id", "job_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"))
    worker: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(64))
    step: Mapped[int | None] = mapped_column(BigInteger)
    value: Mapped[float] = mapped_column(Float)
    at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class WorkerUsageSample(Base):
    """What a worker's container used: a minion's sample (`resolution_s` 0), or the mean of the samples
    of one period once they are older than the raw window (services/jobs/job_usage.py)."""

    __tablename__ = "job_worker_usage"
    __table_args__ = (Index("ix_job_worker_usage_job_worker_at", "job_id", "worker", "at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"))
    worker: Mapped[int] = mapped_column(Integer)
    at: Mapped[float] = mapped_column(Float)  # Unix time (a period's start once downsampled)
    resolution_s: Mapped[int] = mapped_column(Integer, default=0)
    cpu_cores: Mapped[float] = mapped_column(Float)
    memory_bytes: Mapped[int] = mapped_column(BigInteger)
    disk_bytes: Mapped[int] = mapped_column(BigInteger)
    net_rx_bytes: Mapped[int] = mapped_column(BigInteger)
    net_tx_bytes: Mapped[int] = mapped_column(BigInteger)
    gpus: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
