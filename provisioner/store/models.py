"""Typed SQLAlchemy 2 models of the control plane's store.

Schema changes go through Alembic revisions in provisioner/store/migrations/versions/ (never
`create_all`), so SQLite and PostgreSQL stores upgrade the same way. Rows of removed resources are
kept (state `removed`) for the audit trail; uniqueness rules therefore use partial unique indexes
that ignore removed rows. Optimistic locking: every stateful row has a `version` column that
SQLAlchemy checks on UPDATE, so two workers can never both apply a change read from the same row."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, Boolean, DateTime, ForeignKey, Index, Integer, LargeBinary, String, Text, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship, validates
from sqlalchemy.types import TypeDecorator

from provisioner.domain.inventory_gpus import gpu_summary


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_id(prefix: str) -> str:
    """Short, typed, random ids (`node_3f2a…`): readable in tables, unguessable, sortable enough."""
    return f"{prefix}_{secrets.token_hex(8)}"


JOBS_LAN = "jobs_lan"  # Region.settings: its jobs reach the LAN (`provision region update --jobs-lan`)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC timestamps on both backends (SQLite stores naive values)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value

    def result_processor(self, dialect: Any, coltype: Any) -> Callable[[Any], datetime | None] | None:
        """Every timestamp read goes through here (a page of 500 nodes reads 2,000), so no per-value call
        where none is needed: PostgreSQL's columns are all `timestamptz`, which psycopg returns aware, and
        on SQLite the driver's text is parsed and given UTC in one call. TypeDecorator's own chain made two
        Python calls per value: a page of 500 took 3.9 ms to fetch on SQLite with them, 1.7 ms with none."""
        if dialect.name == "postgresql":
            return None
        parse = self.impl_instance.dialect_impl(dialect).result_processor(dialect, coltype)

        def aware(value: Any) -> datetime | None:
            if value is None:
                return None
            if parse is not None:
                value = parse(value)
            return value if value.tzinfo is not None else value.replace(tzinfo=UTC)

        return aware


class Base(DeclarativeBase):
    pass


NOT_REMOVED = text("state != 'removed'")


class Provider(Base):
    __tablename__ = "providers"
    __table_args__ = (
        Index(
            "uq_providers_kind_live",
            "kind",
            unique=True,
            sqlite_where=NOT_REMOVED,
            postgresql_where=NOT_REMOVED,
        ),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: new_id("prv"))
    kind: Mapped[str] = mapped_column(String(32))
    payment_mode: Mapped[str] = mapped_column(String(32))
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)
    # what `provider show` prints; secrets go to `sealed_config` (provisioner/adapters/secrets.py)
    public_config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    sealed_config: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
    version: Mapped[int] = mapped_column(Integer, nullable=False)

    regions: Mapped[list[Region]] = relationship(back_populates="provider")
    __mapper_args__ = {"version_id_col": version}


class Region(Base):
    __tablename__ = "regions"
    __table_args__ = (
        Index(
            "uq_regions_provider_name_live",
            "provider_id",
            "name",
            unique=True,
            sqlite_where=NOT_REMOVED,
            postgresql_where=NOT_REMOVED,
        ),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: new_id("reg"))
    name: Mapped[str] = mapped_column(String(63), index=True)
    provider_id: Mapped[str] = mapped_column(ForeignKey("providers.id"))
    storage_mode: Mapped[str] = mapped_column(String(16))
    public_jobs: Mapped[bool] = mapped_column(Boolean)
    # the account that created it (revision 0014, store/account_models.py); its jobs are preferred here
    account_id: Mapped[str | None] = mapped_column(ForeignKey("accounts.id"), index=True)
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)
    # provider-specific settings returned by Provider.validate_region
    settings: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
    version: Mapped[int] = mapped_column(Integer, nullable=False)

    provider: Mapped[Provider] = relationship(back_populates="regions", lazy="joined")
    nodes: Mapped[list[Node]] = relationship(back_populates="region")
    __mapper_args__ = {"version_id_col": version}

    @property
    def jobs_lan(self) -> bool:
        """Its jobs may reach the private address ranges (docs/minion-jobs.md), settings[JOBS_LAN]."""
        return bool((self.settings or {}).get(JOBS_LAN))


NODE_STORAGE_LIVE = text("service = 'storage' AND state != 'removed'")


class Node(Base):
    __tablename__ = "nodes"
    __table_args__ = (
        Index(
            "uq_nodes_region_name_live",
            "region_id",
            "name",
            unique=True,
            sqlite_where=NOT_REMOVED,
            postgresql_where=NOT_REMOVED,
        ),
        Index(
            "uq_nodes_minion_id_live",
            "minion_id",
            unique=True,
            sqlite_where=NOT_REMOVED,
            postgresql_where=NOT_REMOVED,
        ),
        # one storage node per region, enforced by the database too (races between workers)
        Index(
            "uq_nodes_region_storage_live",
            "region_id",
            unique=True,
            sqlite_where=NODE_STORAGE_LIVE,
            postgresql_where=NODE_STORAGE_LIVE,
        ),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: new_id("node"))
    name: Mapped[str] = mapped_column(String(63), index=True)
    region_id: Mapped[str] = mapped_column(ForeignKey("regions.id"), index=True)
    minion_id: Mapped[str] = mapped_column(String(32), index=True)
    service: Mapped[str] = mapped_column(String(16))
    hostname: Mapped[str | None] = mapped_column(String(253))
    upnp: Mapped[bool] = mapped_column(Boolean)
    mining: Mapped[bool] = mapped_column(Boolean)
    # the ONE lifecycle field (domain.states.NodeState); change it only via services.nodes.transition
    state: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str | None] = mapped_column(Text)
    # reported by the minion when it joins / heartbeats
    inventory: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # what the report's GPUs sum up to (domain/inventory_gpus.py), kept by _summarise on every write
    gpu_count: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    gpu_type: Mapped[str | None] = mapped_column(String(128))
    requirements: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # requirement verdict
    last_heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # beats since the node's row was added (revision 0025; was node_attestations.heartbeats): the quote
    # schedule counts them (NodeAttestation.quote_asked_beat); kept here, a steady beat is one UPDATE
    heartbeats: Mapped[int] = mapped_column(Integer, default=0, server_default="0", nullable=False)
    # join (revision 0002): an EK pinned by the provider (GCP storage nodes: the vTPM's EK, which has no
    # vendor certificate) — when set, only this EK may join as this node.
    pinned_ek_public: Mapped[bytes | None] = mapped_column(LargeBinary)
    # on-node finalize (revision 0008, services/fleet/finalize.py): `provision node retry` counts up
    # (a new generation, so the minion runs the playbook again); the generation the minion last applied
    # with success; when its last finalize report came (the timeout of a node stuck in provisioning)
    finalize_retry: Mapped[int] = mapped_column(Integer, default=0, server_default="0", nullable=False)
    finalize_applied: Mapped[str | None] = mapped_column(String(64))
    finalize_reported_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # what the minion last reported under actual["finalize"] (revision 0011): state, generation and the
    # facts the play found (scratch array and mount, the export); bounded like every report
    finalize_actual: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # what its object cache last reported under actual["objects"] (revision 0032; ObjectsActual)
    object_cache: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # contracts.jobs.NodeImages as the minion last told it (the dry run's image warnings); revision 0035
    images: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # what its NVML says of its GPUs (contracts.gpu_health.GpuHealthReport): placement offers only `ok` ones
    # and takes the node out while one has failed (services/fleet/gpu_health.py); null until it tells
    gpu_health: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
    version: Mapped[int] = mapped_column(Integer, nullable=False)

    region: Mapped[Region] = relationship(back_populates="nodes", lazy="joined")
    __mapper_args__ = {"version_id_col": version}

    @property
    def region_name(self) -> str:
        """Same attribute as on the rows of services.nodes.list_page, so one serialiser fits both."""
        return self.region.name

    @validates("inventory")
    def _summarise(self, _key: str, inventory: dict[str, Any] | None) -> dict[str, Any] | None:
        self.gpu_count, self.gpu_type = gpu_summary(inventory)
        return inventory


class AuditEvent(Base):
    """One line of history: who moved which resource from what to what, when and why."""

    __tablename__ = "audit_events"
    __table_args__ = (Index("ix_audit_resource", "resource_kind", "resource_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    actor: Mapped[str] = mapped_column(String(128))
    resource_kind: Mapped[str] = mapped_column(String(32))
    resource_id: Mapped[str] = mapped_column(String(32))
    resource_name: Mapped[str] = mapped_column(String(128))
    from_state: Mapped[str | None] = mapped_column(String(16))
    to_state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)


class ApiToken(Base):
    """Operator bearer tokens. Only the SHA-256 of a token is stored; the token is shown once."""

    __tablename__ = "api_tokens"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: new_id("tok"))
    name: Mapped[str] = mapped_column(String(64), unique=True)
    # admin | member (services/accounts/accounts.py ROLES) within its account (revision 0014)
    role: Mapped[str] = mapped_column(String(16))
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), index=True)
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # Written at most once a minute per token (services/accounts/tokens.py), so reads stay cheap.
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class RelayPeer(Base):
    """A `provision serve` process that relays node tunnels to other hosts' processes
    (api/tunnel_relay.py): its relay tag, where it listens, and when it last said it lives."""

    __tablename__ = "relay_peers"

    tag: Mapped[str] = mapped_column(String(16), primary_key=True)
    url: Mapped[str] = mapped_column(String(300))
    seen_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
