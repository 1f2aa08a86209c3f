"""Store models of device configurations.

A configuration is named per region and keeps every revision: an update adds one, so a device goes on
running the revision it was deployed with until it is deployed again. The configuration's keys
(third-party credentials) are sealed per revision (provisioner/adapters/secrets.py) and never leave the
control plane except, unsealed, in the desired state of a device that runs that revision.

A device's deployment (one row per device node) keeps what the operator chose (the configuration, the
revision and the deploy generation) apart from what the device's minion reports (`inference_*`), like a
reservation's desired and actual; its container's output is stored as chunks by byte offset per deploy
generation, idempotently, the way job logs are."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column, relationship

from provisioner.store.models import NOT_REMOVED, Base, Node, Region, UTCDateTime, new_id, utcnow


class DeviceConfig(Base):
    __tablename__ = "device_configs"
    __table_args__ = (
        Index(
            "uq_device_configs_region_name_live",
            "region_id",
            "name",
            unique=True,
            sqlite_where=NOT_REMOVED,
            postgresql_where=NOT_REMOVED,
        ),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: new_id("dcf"))
    name: Mapped[str] = mapped_column(String(63))
    region_id: Mapped[str] = mapped_column(ForeignKey("regions.id"), index=True)
    # domain.states.DeviceConfigState; change it only via services.device_configs.transition
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)
    latest_revision: Mapped[int] = mapped_column(Integer, default=1)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
    version: Mapped[int] = mapped_column(Integer, nullable=False)

    region: Mapped[Region] = relationship(lazy="joined")
    __mapper_args__ = {"version_id_col": version}


class DeviceConfigRevision(Base):
    """One revision's container spec: image, model, command, checkpoints, datastore and path, env (JSON);
    the keys sealed as one JSON object {NAME: VALUE}."""

    __tablename__ = "device_config_revisions"
    __table_args__ = (
        Index("uq_device_config_revisions_config_revision", "config_id", "revision", unique=True),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    config_id: Mapped[str] = mapped_column(ForeignKey("device_configs.id"))
    revision: Mapped[int] = mapped_column(Integer)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    sealed_keys: Mapped[str | None] = mapped_column(Text)
    created_by: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class DeviceDeployment(Base):
    """The configuration of one device (a node of service `device`) and what its minion reports of it."""

    __tablename__ = "device_deployments"

    node_id: Mapped[str] = mapped_column(ForeignKey("nodes.id"), primary_key=True)
    config_id: Mapped[str | None] = mapped_column(ForeignKey("device_configs.id"), index=True)
    # the revision `device deploy` deploys (set by set-config to the latest, moved by deploy --latest)
    revision: Mapped[int | None] = mapped_column(Integer)
    # what the device runs: the revision deployed, the deploy's generation (a new one per deploy)
    deployed_revision: Mapped[int | None] = mapped_column(Integer)
    generation: Mapped[str | None] = mapped_column(String(48))
    deploys: Mapped[int] = mapped_column(Integer, default=0)
    deployed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # reported by the minion (contracts.device.InferenceReport); None until the first report
    inference_state: Mapped[str | None] = mapped_column(String(16))
    inference_message: Mapped[str | None] = mapped_column(Text)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    last_lines: Mapped[str | None] = mapped_column(Text)
    # the minion's generation of the container (the deploy's, plus the boot it started in)
    reported_generation: Mapped[str | None] = mapped_column(String(64))
    reported_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    version: Mapped[int] = mapped_column(Integer, nullable=False)

    node: Mapped[Node] = relationship(lazy="joined")
    config: Mapped[DeviceConfig | None] = relationship(lazy="joined")
    __mapper_args__ = {"version_id_col": version}


class DeviceLogChunk(Base):
    """A piece of one inference container's output at byte `offset`; (node, generation, offset) is unique."""

    __tablename__ = "device_log_chunks"
    __table_args__ = (Index("uq_device_log_chunks_offset", "node_id", "generation", "offset", unique=True),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    node_id: Mapped[str] = mapped_column(ForeignKey("nodes.id"))
    generation: Mapped[str] = mapped_column(String(64))
    offset: Mapped[int] = mapped_column(BigInteger)
    size: Mapped[int] = mapped_column(Integer)
    data: Mapped[str] = mapped_column(Text)
    eof: Mapped[bool] = mapped_column(Boolean, default=False)
    at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
