"""Store models: GCP provider bootstrap progress and the storage node record of each GCP region.

The storage node itself is an ordinary `nodes` row (service storage): it joins, heartbeats and moves
through the node lifecycle like any node. What only GCP needs lives here: the zone of the VM the
reconciler made for it (the VM is named after the node), how far creation got (status, for crash-safe
resumption and `--wait` progress),
whether Compute reports the VM running (from the event consumer), and the region's join token for the
VM's enrollment bundle (sealed: the same bundle must go out if an insert is retried after a crash)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Integer, String, Text, select
from sqlalchemy.ext.hybrid import hybrid_property
from sqlalchemy.orm import Mapped, mapped_column, relationship

from provisioner.store.models import Base, Node, UTCDateTime, utcnow


class GcpStorageNode(Base):
    __tablename__ = "gcp_storage_nodes"

    region_id: Mapped[str] = mapped_column(ForeignKey("regions.id"), primary_key=True)
    node_id: Mapped[str] = mapped_column(ForeignKey("nodes.id"), index=True)
    # The VM carries its node's name, and the GCP region is the region's setting `gcp_region`: neither is
    # stored twice (revision 0013 dropped the copies this table kept).
    node: Mapped[Node] = relationship(lazy="joined")
    zone: Mapped[str | None] = mapped_column(String(63))
    # domain.states.VmStatus; change it only through services.lifecycle.apply (VM_TRANSITIONS)
    status: Mapped[str] = mapped_column(String(16), index=True)
    running: Mapped[bool] = mapped_column(Boolean, default=False)  # Compute says RUNNING (events update it)
    progress: Mapped[str | None] = mapped_column(Text)  # last progress line, shown by `--wait`
    error: Mapped[str | None] = mapped_column(Text)
    sealed_join_token: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
    version: Mapped[int] = mapped_column(Integer, nullable=False)
    __mapper_args__ = {"version_id_col": version}

    @hybrid_property
    def instance_name(self) -> str:
        return self.node.name

    @instance_name.inplace.expression
    @classmethod
    def _instance_name(cls) -> Any:
        return select(Node.name).where(Node.id == cls.node_id).scalar_subquery()


class GcpBootstrap(Base):
    """Progress of a GCP provider's project bootstrap / teardown (the resources are found by name,
    so this is for the operator, not for resumption)."""

    __tablename__ = "gcp_bootstraps"

    provider_id: Mapped[str] = mapped_column(ForeignKey("providers.id"), primary_key=True)
    progress: Mapped[str | None] = mapped_column(Text)
    created: Mapped[list[Any]] = mapped_column(JSON, default=list)  # "kind name" of what we created
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)


class GcpBurstVm(Base):
    """The ephemeral VM of one job worker placed on GCP capacity (services/cloud/gcp_burst.py, docs/gcp.md
    "Burst compute for jobs"). Written in the same transaction that places the worker, BEFORE any insert
    call: its id gives the VM's requestId, so a control plane killed between the row and the call makes
    the same VM on its next pass, never a second. Its node (a `nodes` row, named like the VM) is what the
    worker is assigned to; the VM's minion joins as that node."""

    __tablename__ = "gcp_burst_vms"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    # None: a permanent compute node (`node add --gpu-type`), kept until its node is removed
    job_id: Mapped[str | None] = mapped_column(ForeignKey("jobs.id"), index=True)
    worker_index: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer)  # the job's placement number it was made for
    node_id: Mapped[str] = mapped_column(ForeignKey("nodes.id"), unique=True)
    region_id: Mapped[str] = mapped_column(ForeignKey("regions.id"), index=True)
    instance_name: Mapped[str] = mapped_column(String(63), unique=True)
    gpu_type: Mapped[str] = mapped_column(String(32))  # the GCP catalogue's name (regions/gcp-gpus.yaml)
    gpu_count: Mapped[int] = mapped_column(Integer)
    cpus: Mapped[int] = mapped_column(Integer)  # vCPUs it holds of the family's CPU quota
    local_ssds: Mapped[int] = mapped_column(Integer)  # 375 GB partitions, for the job's disk
    preemptible: Mapped[bool] = mapped_column(Boolean, default=False)  # Spot provisioning model
    reservation: Mapped[str | None] = mapped_column(String(63))  # a Compute reservation it consumes
    price_per_gpu_hour: Mapped[float] = mapped_column(Float)
    # the region's join token for the VM's enrollment bundle, sealed (a retried insert sends the same one)
    sealed_join_token: Mapped[str] = mapped_column(Text)
    preempted_at: Mapped[datetime | None] = mapped_column(UTCDateTime)  # Google took the Spot VM back
    zone: Mapped[str | None] = mapped_column(String(63))
    # domain.states.BurstVmState; change it only through services.gcp_burst (BURST_VM_TRANSITIONS)
    state: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str | None] = mapped_column(Text)
    # when Compute confirmed the VM: quota read after this already counts it (services.gcp_capacity)
    inserted_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
    version: Mapped[int] = mapped_column(Integer, nullable=False)
    __mapper_args__ = {"version_id_col": version}


class GcpQuotaCache(Base):
    """The last quota read of a GCP region (refreshed in the background by the gcp-burst reconciler), so
    placement never calls Google. The row is also the region's booking lock: placing a worker on GCP
    locks it and bumps `bookings` (services.gcp_capacity), so two jobs never take the same last GPU."""

    __tablename__ = "gcp_quota_cache"

    region_id: Mapped[str] = mapped_column(ForeignKey("regions.id"), primary_key=True)
    quotas: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # metric → [limit, usage]
    fetched_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    error: Mapped[str | None] = mapped_column(Text)  # why the last refresh failed (the old read stays)
    bookings: Mapped[int] = mapped_column(Integer, default=0)
    version: Mapped[int] = mapped_column(Integer, nullable=False)
    __mapper_args__ = {"version_id_col": version}
