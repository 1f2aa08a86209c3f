"""Store models: reservations and datastores (regional resources).

A reservation keeps what the operator wants (`state`: unassigned/assigned, `node_id`) apart from
what the assigned node reports (`actual_*`), so `reservation show` can print both and a stale
report can never overwrite an operator's decision. Uniqueness per region (name, hostname, port) is
enforced by partial unique indexes that ignore removed rows, like the foundation's models, so two
API workers racing on the same hostname cannot both win."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, ForeignKey, Index, Integer, String, Text, false
from sqlalchemy.orm import Mapped, mapped_column, relationship

from provisioner.store.models import NOT_REMOVED, Base, Node, Region, UTCDateTime, new_id, utcnow


class Reservation(Base):
    __tablename__ = "reservations"
    __table_args__ = (
        Index(
            "uq_reservations_region_name_live",
            "region_id",
            "name",
            unique=True,
            sqlite_where=NOT_REMOVED,
            postgresql_where=NOT_REMOVED,
        ),
        Index(
            "uq_reservations_region_hostname_live",
            "region_id",
            "hostname",
            unique=True,
            sqlite_where=NOT_REMOVED,
            postgresql_where=NOT_REMOVED,
        ),
        # one port per region whatever the protocol: the router maps external PORT for the region
        Index(
            "uq_reservations_region_port_live",
            "region_id",
            "port",
            unique=True,
            sqlite_where=NOT_REMOVED,
            postgresql_where=NOT_REMOVED,
        ),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: new_id("rsv"))
    name: Mapped[str] = mapped_column(String(63))
    region_id: Mapped[str] = mapped_column(ForeignKey("regions.id"), index=True)
    hostname: Mapped[str] = mapped_column(String(63))
    port: Mapped[int] = mapped_column(Integer)
    protocol: Mapped[str] = mapped_column(String(8))
    # the router maps the port (UPnP, nodes with UPnP on only) when true; LAN-only by default
    expose_wan: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false(), nullable=False)
    # desired (domain.states.ReservationState); change it only via services.reservations.transition
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)
    node_id: Mapped[str | None] = mapped_column(ForeignKey("nodes.id"), index=True)
    # actual, as reported by the assigned node (domain.states.ActualState); null while unassigned
    actual_state: Mapped[str | None] = mapped_column(String(16))
    actual_reason: Mapped[str | None] = mapped_column(Text)
    address: Mapped[str | None] = mapped_column(String(64))
    external_address: Mapped[str | None] = mapped_column(String(80))
    mdns: Mapped[str | None] = mapped_column(String(24))
    upnp: Mapped[str | None] = mapped_column(String(24))
    reported_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # the node the actual_* came from: a job's reservation moves with no operator step to clear them, so
    # `reservation show` trusts them only from the node that serves it now (services.reservations)
    reported_by: Mapped[str | None] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
    version: Mapped[int] = mapped_column(Integer, nullable=False)

    region: Mapped[Region] = relationship(lazy="joined")
    node: Mapped[Node | None] = relationship(lazy="joined")
    __mapper_args__ = {"version_id_col": version}


class Datastore(Base):
    """An NFS or SMB share of a region. The SMB password is sealed (provisioner/adapters/secrets.py) and never
    leaves the control plane through the operator API."""

    __tablename__ = "datastores"
    __table_args__ = (
        Index(
            "uq_datastores_region_name_live",
            "region_id",
            "name",
            unique=True,
            sqlite_where=NOT_REMOVED,
            postgresql_where=NOT_REMOVED,
        ),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: new_id("ds"))
    name: Mapped[str] = mapped_column(String(63))
    region_id: Mapped[str] = mapped_column(ForeignKey("regions.id"), index=True)
    type: Mapped[str] = mapped_column(String(8))
    address: Mapped[str] = mapped_column(String(253))
    root: Mapped[str] = mapped_column(Text)
    username: Mapped[str | None] = mapped_column(String(256))
    sealed_password: Mapped[str | None] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
    version: Mapped[int] = mapped_column(Integer, nullable=False)

    region: Mapped[Region] = relationship(lazy="joined")
    __mapper_args__ = {"version_id_col": version}
