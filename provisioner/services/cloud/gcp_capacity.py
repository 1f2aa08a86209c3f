"""GCP capacity as placement candidates (the `CandidateSource.GCP` capacity source of services.job_placement).

Per GCP region rigbase runs (provider enabled, region not errored or leaving) and per GPU type the region
offers to jobs, one on-demand candidate and, where the catalogue has a Spot price, one Spot candidate:
- free GPUs = capacity.gpu_capacity's runnable 1-GPU jobs (min of free GPUs, free CPUs ÷ CPUs per GPU,
  free local SSD ÷ 375 GB) over the region's CACHED quota (gcp_quota_cache, refreshed in the background
  by the gcp-burst reconciler: placement never calls Google), after adding to the quota's usage what our
  burst VMs hold that the cached read does not count yet (`in_flight`): every live VM Compute had not
  confirmed when the quota was read. A Spot candidate's count is of the preemptible quotas where the
  project has them (capacity.metrics_for), and Spot VMs in flight hold those;
- price per GPU-hour = Google's list price (on-demand or the Spot estimate, regions/gcp-gpus.yaml) plus
  the usage fee of the GPU's class (rigbase's fee on any hardware), so an owned node of the same class is
  always cheaper and takes the job first ("own the base, rent the burst");
- a zone stockout (every zone refused a VM of that type and model) keeps the candidate at 0 free for
  STOCKOUT_COOLDOWN, so waiting jobs do not ask Google again on every pass.

`book` is the capacity accounting: placing a worker on a GCP candidate locks the region's cache row and
counts again inside that transaction, so two jobs racing for the last GPU never both get a VM."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any, NamedTuple, Protocol

from sqlalchemy import select
from sqlalchemy.orm import Session

from provisioner.domain import billing_rules
from provisioner.domain.placement import Candidate, CandidateSource
from provisioner.domain.states import (
    BURST_VM_LIVE,
    REGION_SETTLED_BAD,
    BurstVmState,
    NodeState,
    ProviderState,
)
from provisioner.providers.base import Feature, kinds_supporting
from provisioner.providers.gcp import catalogue
from provisioner.providers.gcp.capacity import LOCAL_SSD_PARTITION_GB, Quota, metrics_for
from provisioner.providers.gcp.capacity import gpu_capacity as capacity_rule
from provisioner.services.billing import prices
from provisioner.store.gcp_models import GcpBurstVm, GcpQuotaCache
from provisioner.store.models import Provider, Region

STOCKOUT_COOLDOWN = timedelta(minutes=10)
ON_DEMAND, SPOT = "on-demand", "spot"


@dataclass(frozen=True)
class GcpRegionView:
    """One GCP region as the capacity source reads it (no ORM objects kept)."""

    region_id: str
    name: str
    account_id: str | None
    public_jobs: bool
    provider: str  # the region's provider kind
    gcp_region: str
    quotas: dict[str, Quota]
    fetched_at: datetime | None


def candidate_id(region_id: str, gpu: str, model: str) -> str:
    return f"gcp/{region_id}/{gpu}/{model}"


def parse_candidate_id(cid: str) -> tuple[str, str, bool]:
    """(region_id, GCP GPU type name, preemptible) of a GCP candidate's id."""
    _, region_id, gpu, model = cid.split("/", 3)
    return region_id, gpu, model == SPOT


def _quotas_from(stored: Mapping[str, Any] | None) -> dict[str, Quota]:
    """The cache's JSON (metric → [limit, usage]) as Quotas."""
    return {
        metric: Quota(limit=float(pair[0]), usage=float(pair[1])) for metric, pair in (stored or {}).items()
    }


def quotas_of(row: GcpQuotaCache | None) -> dict[str, Quota]:
    return _quotas_from(row.quotas if row else None)


def regions(session: Session) -> list[GcpRegionView]:
    """The GCP regions jobs may burst into, with their cached quota (columns only: this runs in every
    placement, and ORM regions would load their relationships)."""
    rows = session.execute(
        select(
            Region.id,
            Region.name,
            Region.account_id,
            Region.public_jobs,
            Region.settings,
            Provider.kind,
            GcpQuotaCache.quotas,
            GcpQuotaCache.fetched_at,
        )
        .join(Provider, Provider.id == Region.provider_id)
        .outerjoin(GcpQuotaCache, GcpQuotaCache.region_id == Region.id)
        .where(
            Provider.kind.in_(kinds_supporting(Feature.QUOTA)),
            Provider.state == ProviderState.ENABLED,
            Region.state.not_in([s.value for s in REGION_SETTLED_BAD]),
        )
    )
    return [
        GcpRegionView(
            region_id=region_id,
            name=name,
            account_id=account_id,
            public_jobs=bool(public_jobs),
            provider=provider,
            gcp_region=str((settings or {}).get("gcp_region") or name),
            quotas=_quotas_from(quotas),
            fetched_at=fetched_at,
        )
        for region_id, name, account_id, public_jobs, settings, provider, quotas, fetched_at in rows
    ]


def _aware(at: datetime | None) -> datetime | None:
    return at.replace(tzinfo=UTC) if at is not None and at.tzinfo is None else at


def in_flight(
    vms: Iterable[HoldsQuota],
    fetched_at: datetime | None,
    cat: catalogue.Catalogue,
    quotas: Mapping[str, Quota],
) -> dict[str, float]:
    """Quota our live burst VMs hold that a read at `fetched_at` does not count: every one Compute had not
    confirmed by then (pending, creating, or created after the read). metric → amount."""
    fetched = _aware(fetched_at)
    held: dict[str, float] = {}
    for vm in vms:
        inserted = _aware(vm.inserted_at)
        if fetched is not None and inserted is not None and inserted <= fetched:
            continue  # Compute's usage already counts it
        gpu = cat.gpus.get(vm.gpu_type)
        if gpu is None:
            continue
        metrics = metrics_for(gpu, quotas, bool(vm.preemptible))  # a Spot VM holds preemptible quota
        for metric, amount in (
            (metrics.gpus, vm.gpu_count),
            (metrics.cpus, vm.cpus),
            (metrics.local_ssd, vm.local_ssds * LOCAL_SSD_PARTITION_GB),
        ):
            held[metric] = held.get(metric, 0.0) + amount
    return held


def effective_quotas(quotas: Mapping[str, Quota], held: Mapping[str, float]) -> dict[str, Quota]:
    return {m: Quota(q.limit, q.usage + held.get(m, 0.0)) for m, q in quotas.items()}


def price_of(gpu: catalogue.GpuType, spot: bool) -> float:
    """What a GPU-hour on this VM costs the job's account: Google's price plus rigbase's usage fee."""
    google = (
        gpu.spot_price_per_gpu_hour
        if spot and gpu.spot_price_per_gpu_hour is not None
        else gpu.price_per_gpu_hour
    )
    fee = float(billing_rules.usage_fee_per_gpu_hour(prices.gpu_class_of(gpu.job_gpu_type)))
    return round(google + fee, 6)


class HoldsQuota(Protocol):
    """What `in_flight` reads of a burst VM (a GcpBurstVm row, or its columns)."""

    @property
    def gpu_type(self) -> str: ...
    @property
    def gpu_count(self) -> int: ...
    @property
    def cpus(self) -> int: ...
    @property
    def local_ssds(self) -> int: ...
    @property
    def inserted_at(self) -> datetime | None: ...
    @property
    def preemptible(self) -> bool: ...


class _VmRow(NamedTuple):
    region_id: str
    gpu_type: str
    gpu_count: int
    cpus: int
    local_ssds: int
    inserted_at: datetime | None
    state: str
    preemptible: bool


def _burst_vms(
    session: Session, region_ids: list[str], now: datetime
) -> tuple[dict[str, list[_VmRow]], set[tuple[str, str, bool]]]:
    """One query for both: the live VMs by region, and (region_id, gpu, preemptible) whose zones all
    refused a VM within STOCKOUT_COOLDOWN."""
    live: dict[str, list[_VmRow]] = {}
    stocked_out: set[tuple[str, str, bool]] = set()
    rows = session.execute(
        select(
            GcpBurstVm.region_id,
            GcpBurstVm.gpu_type,
            GcpBurstVm.gpu_count,
            GcpBurstVm.cpus,
            GcpBurstVm.local_ssds,
            GcpBurstVm.inserted_at,
            GcpBurstVm.state,
            GcpBurstVm.preemptible,
        ).where(
            GcpBurstVm.region_id.in_(region_ids),
            GcpBurstVm.state.in_([s.value for s in BURST_VM_LIVE])
            | (
                (GcpBurstVm.state == BurstVmState.FAILED) & (GcpBurstVm.updated_at >= now - STOCKOUT_COOLDOWN)
            ),
        )
    )
    for row in rows:
        vm = _VmRow(*row)
        if vm.state == BurstVmState.FAILED:
            stocked_out.add((vm.region_id, vm.gpu_type, bool(vm.preemptible)))
        else:
            live.setdefault(vm.region_id, []).append(vm)
    return live, stocked_out


def runnable(
    view: GcpRegionView, gpu: catalogue.GpuType, held: Mapping[str, float], preemptible: bool = False
) -> int:
    return capacity_rule(gpu, effective_quotas(view.quotas, held), preemptible).runnable_jobs


@lru_cache(maxsize=64)
def _offers(gcp_region: str) -> tuple[tuple[catalogue.GpuType, tuple[tuple[str, bool, float], ...]], ...]:
    """Per GPU type the region offers to jobs: (model, preemptible, price) of each candidate. The
    catalogue never changes at run time, so this is worked out once per region."""
    out = []
    for gpu in catalogue.load().gpus_in(gcp_region):
        if gpu.job_gpu_type is None:
            continue
        models = [(ON_DEMAND, False, price_of(gpu, False))]
        if gpu.spot_price_per_gpu_hour is not None:
            models.append((SPOT, True, price_of(gpu, True)))
        out.append((gpu, tuple(models)))
    return tuple(out)


# The last answer and what it was computed from, as ONE tuple (swapped atomically between threads):
# placement runs far more often than the quota or the burst VMs change, and building 100 frozen
# Candidates costs more than the two queries.
_memo: list[tuple[Any, tuple[Candidate, ...]]] = [(None, ())]


def gcp_candidates(session: Session, now: datetime | None = None) -> list[Candidate]:
    """The GCP capacity source (module docstring): two queries, no call to Google."""
    now = now or datetime.now(UTC)
    views = regions(session)
    if not views:
        return []
    live, stocked_out = _burst_vms(session, [v.region_id for v in views], now)
    key = (
        tuple(
            (
                v.region_id,
                v.name,
                v.account_id,
                v.public_jobs,
                v.gcp_region,
                v.fetched_at,
                tuple(v.quotas.items()),
            )
            for v in views
        ),
        tuple((r, tuple(vms)) for r, vms in sorted(live.items())),
        frozenset(stocked_out),
    )
    seen, answer = _memo[0]
    if seen != key:
        answer = tuple(_build(views, live, stocked_out))
        _memo[0] = (key, answer)
    return list(answer)


def _build(
    views: list[GcpRegionView], live: Mapping[str, list[_VmRow]], stocked_out: set[tuple[str, str, bool]]
) -> list[Candidate]:
    cat = catalogue.load()
    out: list[Candidate] = []
    for view in views:
        if view.gcp_region not in cat.regions:
            continue
        held = in_flight(live.get(view.region_id, []), view.fetched_at, cat, view.quotas)
        quotas = effective_quotas(view.quotas, held)
        for gpu, models in _offers(view.gcp_region):
            for model, spot, price in models:
                free = capacity_rule(gpu, quotas, spot).runnable_jobs
                gone = (view.region_id, gpu.name, spot) in stocked_out
                out.append(
                    Candidate(
                        source=CandidateSource.GCP.value,
                        id=candidate_id(view.region_id, gpu.name, model),
                        name=f"{gpu.machine_type} {model}",
                        region=view.name,
                        region_account_id=view.account_id,
                        region_public_jobs=view.public_jobs,
                        provider=view.provider,
                        gpu_type=gpu.job_gpu_type,
                        gpus_total=free,
                        gpus_free=0 if gone else free,
                        vcpus=gpu.cpus_per_gpu,
                        memory_gib=gpu.machine_memory_gb,
                        price_per_gpu_hour=price,
                        state=NodeState.ACTIVE.value,  # made when asked for
                        online=True,
                        requirements_ok=True,
                        vcpus_free=0,  # CPU-only jobs do not burst: a GPU VM would idle its GPU
                        preemptible=spot,
                    )
                )
    return out


def cache_age_s(session: Session, now: datetime | None = None) -> dict[str, float | None]:
    """Region name → seconds since its quota was read (None: never), for `--dry-run` and the docs."""
    now = now or datetime.now(UTC)
    out: dict[str, float | None] = {}
    for view in regions(session):
        fetched = _aware(view.fetched_at)
        out[view.name] = (now - fetched).total_seconds() if fetched else None
    return out


def store_quotas(session: Session, region_id: str, quotas: Mapping[str, Quota], at: datetime) -> None:
    row = session.get(GcpQuotaCache, region_id) or GcpQuotaCache(region_id=region_id, bookings=0)
    row.quotas = {m: [q.limit, q.usage] for m, q in quotas.items()}
    row.fetched_at = at
    row.error = None
    session.add(row)


def book(
    session: Session, region_id: str, gpu_name: str, workers: int, preemptible: bool = False
) -> str | None:
    """Take `workers` 1-GPU VMs of `gpu_name` (Spot VMs when `preemptible`, which spend the region's
    preemptible quotas where the project has them) in the region, or say why not (None: booked). Locks the
    region's cache row (FOR UPDATE on PostgreSQL; SQLite transactions are serial already) and counts the
    live VMs again after the lock, so a concurrent booking committed meanwhile is seen."""
    cat = catalogue.load()
    row = session.scalar(select(GcpQuotaCache).where(GcpQuotaCache.region_id == region_id).with_for_update())
    region = session.get(Region, region_id)
    if row is None or region is None:
        return "its quota has not been read yet"
    gpu = cat.gpus.get(gpu_name)
    if gpu is None:
        return f"GPU type {gpu_name} is not in the catalogue"
    view = GcpRegionView(
        region_id=region_id,
        name=region.name,
        account_id=region.account_id,
        public_jobs=bool(region.public_jobs),
        provider=region.provider.kind,
        gcp_region=str((region.settings or {}).get("gcp_region") or region.name),
        quotas=quotas_of(row),
        fetched_at=row.fetched_at,
    )
    vms = list(
        session.scalars(
            select(GcpBurstVm)
            .where(GcpBurstVm.region_id == region_id, GcpBurstVm.state.in_([s.value for s in BURST_VM_LIVE]))
            .execution_options(populate_existing=True)
        )
    )
    free = runnable(view, gpu, in_flight(vms, view.fetched_at, cat, view.quotas), preemptible)
    if free < workers:
        kind = "Spot " if preemptible else ""
        return (
            f"GCP {view.gcp_region} has quota for {free} more {gpu.name} {kind}VM(s), the job needs {workers}"
        )
    row.bookings += 1  # a write under the lock: the next booking waits for this one to commit
    return None


def describe_quota(row: GcpQuotaCache | None) -> dict[str, Any]:
    return {"fetched_at": row.fetched_at if row else None, "error": row.error if row else None}
