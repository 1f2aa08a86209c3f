"""Store models: a project's datasets, models and checkpoints (services/data/data_objects.py), and which
of them each job mounts.

The object's bytes are not here: they are chunks and a manifest in the object store
(provisioner/adapters/object_store.py), named by the object's project and digest. A name is unique per
project and kind among objects that are not removed (a partial unique index, as for datastores), so a
failed object can be removed and created again under its name."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Boolean, ForeignKey, Index, Integer, String, Text, false
from sqlalchemy.orm import Mapped, mapped_column

from provisioner.store.models import NOT_REMOVED, Base, UTCDateTime, new_id, utcnow


class DataObject(Base):
    __tablename__ = "data_objects"
    __table_args__ = (
        Index(
            "uq_data_objects_project_kind_name_live",
            "project_id",
            "kind",
            "name",
            unique=True,
            sqlite_where=NOT_REMOVED,
            postgresql_where=NOT_REMOVED,
        ),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: new_id("obj"))
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"), index=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(128))
    source: Mapped[str] = mapped_column(Text)  # as given: a URI, or `upload:PATH` for the CLI's upload
    endpoint_url: Mapped[str | None] = mapped_column(Text)  # an S3-compatible store's endpoint
    key_name: Mapped[str | None] = mapped_column(String(253))  # the project key that reads the source
    public: Mapped[bool] = mapped_column(Boolean, server_default=false(), default=False)
    # an inference job's one-time input: removed when that job ends
    job_id: Mapped[str | None] = mapped_column(String(32), index=True)
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)
    digest: Mapped[str | None] = mapped_column(String(71))  # sha256:HEX of the manifest, once ready
    size_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    file_count: Mapped[int] = mapped_column(Integer, default=0)
    created_by: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    ready_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
    version: Mapped[int] = mapped_column(Integer, nullable=False)

    __mapper_args__ = {"version_id_col": version}


class JobObject(Base):
    """An object a job's workers mount, resolved when the job was created (a later object of the same name
    does not change a job that exists)."""

    __tablename__ = "job_objects"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    object_id: Mapped[str] = mapped_column(ForeignKey("data_objects.id"), primary_key=True, index=True)
    target: Mapped[str] = mapped_column(String(4096))  # where the workers see it, e.g. /opt/ml/input


class JobOutput(Base):
    """What a worker left in its own /opt/ml/output, uploaded by its node when it ended: a manifest in the
    object store under the job's project, kept for `provision job output`, and delivered where the spec's
    `data.output` says (a bucket URI, a new object) by the objects reconciler."""

    __tablename__ = "job_outputs"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    worker: Mapped[int] = mapped_column(Integer, primary_key=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"), index=True)
    digest: Mapped[str] = mapped_column(String(71))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    file_count: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16), index=True)
    destination: Mapped[str | None] = mapped_column(Text)  # where it went: a URI, `dataset NAME`; None: kept
    reason: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
