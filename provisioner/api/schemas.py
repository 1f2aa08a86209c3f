"""Wire shapes of the operator API (pydantic 2). Lists are pages: {"items": [...], "next": cursor}."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from contracts.messages import bounded_report
from provisioner.domain.states import is_online
from provisioner.store.models import AuditEvent, Node, Provider, Region

T = TypeVar("T")


class ErrorOut(BaseModel):
    """Every refusal's body (provisioner/api/errors.py): a stable code and one human line."""

    code: str = Field(description="stable, machine-readable: `not_found`, `token_invalid`, …")
    message: str = Field(description="one line saying what went wrong and what to do about it")


class Page(BaseModel, Generic[T]):
    items: list[T]
    next: str | None = Field(None, description="cursor for the next page (`after=`); null at the end")


class ProviderIn(BaseModel):
    kind: str
    payment_mode: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)


class ProviderOut(BaseModel):
    id: str
    kind: str
    payment_mode: str
    state: str
    reason: str | None
    config: dict[str, Any]
    created_at: datetime

    @classmethod
    def of(cls, p: Provider) -> ProviderOut:
        return cls(
            id=p.id,
            kind=p.kind,
            payment_mode=p.payment_mode,
            state=p.state,
            reason=p.reason,
            config=p.public_config or {},
            created_at=p.created_at,
        )


class RegionIn(BaseModel):
    name: str
    provider: str
    storage_mode: str = "local"
    public_jobs: bool = True
    options: dict[str, Any] = Field(default_factory=dict)


class RegionSettingsIn(BaseModel):
    """PATCH /v1/regions/{ref}: the settings an operator changes after create; None leaves one as is."""

    model_config = ConfigDict(extra="forbid")

    public_jobs: bool | None = None
    jobs_lan: bool | None = Field(
        None, description="its jobs may reach the private address ranges (never the node or metadata server)"
    )


class RegionOut(BaseModel):
    id: str
    name: str
    provider: str
    provider_id: str
    storage_mode: str
    public_jobs: bool
    jobs_lan: bool = Field(description="its jobs reach the LAN (docs/minion-jobs.md)")
    state: str
    reason: str | None
    settings: dict[str, Any]
    account_id: str | None = Field(None, description="the account that created it (its owner)")
    created_at: datetime
    credits_earned: Decimal | None = Field(
        None, description="credits its owner earned from public jobs here, all time (region show only)"
    )

    @classmethod
    def of(cls, r: Region) -> RegionOut:
        return cls(
            id=r.id,
            name=r.name,
            provider=r.provider.kind,
            provider_id=r.provider_id,
            storage_mode=r.storage_mode,
            public_jobs=r.public_jobs,
            jobs_lan=r.jobs_lan,
            state=r.state,
            reason=r.reason,
            settings=r.settings or {},
            account_id=r.account_id,
            created_at=r.created_at,
        )


class NodeIn(BaseModel):
    name: str
    region: str
    minion_id: str
    service: str = "compute"
    hostname: str | None = None
    upnp: bool = True
    mining: bool = False


# What a node list shows instead of a report stored before reports were bounded (contracts/messages.py):
# one such node must not make the whole list fail to serialise.
UNREADABLE_REPORT: dict[str, Any] = {
    "unreadable": "the stored report exceeds the size or depth a report may have; the node's next "
    "report replaces it"
}


def _readable(report: dict[str, Any] | None) -> dict[str, Any] | None:
    if report is None:
        return None
    try:
        return bounded_report(report)
    except (ValueError, TypeError, RecursionError):
        return UNREADABLE_REPORT


class NodeOut(BaseModel):
    id: str
    name: str
    region: str
    region_id: str
    minion_id: str
    service: str
    hostname: str | None
    upnp: bool
    mining: bool
    state: str
    reason: str | None
    online: bool = Field(description="derived: last heartbeat within the online window")
    last_heartbeat_at: datetime | None
    last_quote_at: datetime | None = Field(
        None, description="the last verified continuous-attestation quote (null: none since the join)"
    )
    identity: str | None = Field(
        None,
        description="what the minion proved itself with at its last join: `tpm` (EK, AK, quotes) or "
        "`device-key` (a device without a TPM; null: not joined yet). Shown by node and device show",
    )
    inventory: dict[str, Any] | None
    requirements: dict[str, Any] | None
    finalize_applied: str | None = Field(
        None, description="the finalize generation the node's minion last applied with success (null: none)"
    )
    finalize_retry: int = Field(
        0, description="`provision node retry` count: part of the finalize generation"
    )
    finalize_actual: dict[str, Any] | None = Field(
        None, description="what the minion last reported of its finalize: state, generation, facts"
    )
    object_cache: dict[str, Any] | None = Field(
        None,
        description="what its object cache last reported: role, the digests "
        "held whole, used and budget bytes, what it fetches and what waits for room",
    )
    gpu_health: dict[str, Any] | None = Field(
        None,
        description="what its NVML last said of each GPU (GpuHealthReport): facts, counters and state "
        "(ok: offered; busy, lost: not offered; failed: the node takes no job); null until it tells",
    )
    created_at: datetime
    updated_at: datetime
    version: int

    @classmethod
    def of(cls, n: Node | Any) -> NodeOut:
        """From a Node. `last_quote_at` and `identity` live in the node's attestation record: a Node does
        not carry them (`show` adds them, services.nodes). The node list writes its pages itself
        (api/node_page.py)."""
        # model_construct: the store's typed columns need no re-validation (pages of 500 stay cheap)
        return cls.model_construct(
            id=n.id,
            name=n.name,
            region=n.region_name,
            region_id=n.region_id,
            minion_id=n.minion_id,
            service=n.service,
            hostname=n.hostname,
            upnp=n.upnp,
            mining=n.mining,
            state=n.state,
            reason=n.reason,
            online=is_online(n.last_heartbeat_at),
            last_heartbeat_at=n.last_heartbeat_at,
            last_quote_at=getattr(n, "last_quote_at", None),
            identity=getattr(n, "identity", None),
            inventory=n.inventory,
            requirements=n.requirements,
            finalize_applied=n.finalize_applied,
            finalize_retry=n.finalize_retry or 0,
            finalize_actual=getattr(n, "finalize_actual", None),
            object_cache=getattr(n, "object_cache", None),
            gpu_health=getattr(n, "gpu_health", None),
            created_at=n.created_at,
            updated_at=n.updated_at,
            version=n.version,
        )

    def readable(self) -> NodeOut:
        """This node with any out-of-bounds stored report replaced by UNREADABLE_REPORT."""
        return self.model_copy(
            update={"inventory": _readable(self.inventory), "requirements": _readable(self.requirements)}
        )


class FinalizeReportOut(BaseModel):
    """The answer to a FinalizeReport (contracts/finalize.py): the node's state after it."""

    node_id: str
    state: str
    generation: str


class ReplaceIn(BaseModel):
    minion_id: str


# Operator free text (reasons) goes into audit lines and one-line listings: one printable line, bounded.
REASON_MAX_LENGTH = 500


class MaintenanceIn(BaseModel):
    mode: str = Field(description="on | off | toggle")
    reason: str | None = Field(
        None,
        max_length=REASON_MAX_LENGTH,
        pattern=r"^[^\x00-\x1f\x7f]*$",
        description=f"one line, at most {REASON_MAX_LENGTH} characters",
    )


class EventOut(BaseModel):
    id: int
    at: datetime
    actor: str
    resource_id: str
    name: str
    from_state: str | None
    to_state: str
    reason: str | None
    # history lists are stateful-resource lists too: `state` is the state the event moved to
    state: str

    @classmethod
    def of(cls, e: AuditEvent) -> EventOut:
        return cls(
            id=e.id,
            at=e.at,
            actor=e.actor,
            resource_id=e.resource_id,
            name=e.resource_name,
            from_state=e.from_state,
            to_state=e.to_state,
            reason=e.reason,
            state=e.to_state,
        )
