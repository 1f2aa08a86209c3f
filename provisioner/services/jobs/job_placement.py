"""The fleet as placement sees it: every live compute node of the store as a `domain.placement.Candidate`,
with the GPUs and vCPUs its running workers leave free and the price a job would pay there.

Price per GPU-hour (docs/jobs.md "Price", docs/billing.md): on another account's region (a public job) the
region's own price list when its owner set one (`region.settings["gpu_prices"]`, GPU type → credits per
GPU-hour), else the public price list (`provision price list`, services/billing/prices.py); on the job's own
account's region the usage fee of the GPU's class (billing_rules: development 0.05, professional 0.10,
datacenter 0.25). A CPU-only node has no GPU-hour price (0). A snapshot carries the public price;
`priced_for` gives the prices one account sees. The job's price is the chosen candidate's, locked when the
job is created (services.jobs)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from contracts.regional import StorageMode
from provisioner.domain import billing_rules
from provisioner.domain.hardware_text import failed_rules
from provisioner.domain.inventory_gpus import gpu_type_of as gpu_type_of
from provisioner.domain.inventory_gpus import gpus_of
from provisioner.domain.placement import UNOFFERED_WHY, Candidate, CandidateSource, PlacementRequest
from provisioner.domain.states import WORKER_ON_NODE, NodeState, Service, is_online
from provisioner.services.billing import prices
from provisioner.services.cloud import gcp_capacity
from provisioner.services.fleet import gpu_health
from provisioner.services.objects import node_caches
from provisioner.store.gcp_models import GcpBurstVm
from provisioner.store.job_models import JobWorker
from provisioner.store.models import Node

GIB = 2**30


@dataclass(frozen=True)
class Busy:
    """What the workers on one node hold now."""

    gpus: int = 0
    vcpus: int = 0


def price_of(
    region_settings: Mapping[str, Any] | None,
    inventory: Mapping[str, Any] | None,
    public: Mapping[str, float],
) -> float:
    """The public price per GPU-hour on this node (module docstring); `public`: the price list by type."""
    if not gpus_of(inventory):
        return 0.0
    model = gpu_type_of(inventory)
    prices_here = (region_settings or {}).get("gpu_prices")
    if isinstance(prices_here, Mapping) and model in prices_here:
        try:
            return float(prices_here[model])
        except (TypeError, ValueError):
            pass  # a malformed price list falls back to the public list rather than blocking placement
    if model is not None and model in public:
        return public[model]
    return float(billing_rules.usage_fee_per_gpu_hour(prices.gpu_class_of(model)))


def usage_fee_of(candidate: Candidate) -> float:
    """What a GPU-hour costs on the job's own account's hardware: the usage fee of its class."""
    return float(billing_rules.usage_fee_per_gpu_hour(prices.gpu_class_of(candidate.gpu_type)))


def priced_for(candidates: Iterable[Candidate], account_id: str) -> list[Candidate]:
    """The candidates with the prices `account_id` pays: its own regions at the usage fee. A GCP burst VM
    keeps its price (Google's price plus the usage fee, services.gcp_capacity) on any account's region:
    the account pays Google for it whoever owns the region."""
    return [
        replace(c, price_per_gpu_hour=usage_fee_of(c))
        if c.region_account_id == account_id and c.source != CandidateSource.GCP
        else c
        for c in candidates
    ]


def allowed(candidates: Iterable[Candidate], request: PlacementRequest) -> list[Candidate]:
    """What this job may be offered at all: Spot capacity only to a job that says `preemptible: true`,
    and GCP burst VMs (one GPU each, the catalogue's 1-GPU machine shape) only to 1-GPU workers."""
    return [
        c
        for c in candidates
        if c.source != CandidateSource.GCP
        or (request.gpu_count == 1 and (request.preemptible or not c.preemptible))
    ]


def _vcpus(inventory: Mapping[str, Any] | None) -> int:
    cpu = (inventory or {}).get("cpu")
    if not isinstance(cpu, Mapping):
        return 0
    return int(cpu.get("threads") or cpu.get("physical_cores") or 0)


def busy_by_node(session: Session) -> dict[str, Busy]:
    """GPUs and vCPUs held on each node by workers that are starting or running there (each worker holds
    its own group's: JobWorker.gpu_count, .cpu_count)."""
    rows = session.execute(
        select(JobWorker.node_id, func.sum(JobWorker.gpu_count), func.sum(JobWorker.cpu_count))
        .where(JobWorker.node_id.is_not(None), JobWorker.state.in_([s.value for s in WORKER_ON_NODE]))
        .group_by(JobWorker.node_id)
    )
    return {str(node): Busy(gpus=int(gpus or 0), vcpus=int(cpus or 0)) for node, gpus, cpus in rows}


def candidate_of(
    node: Node,
    busy: Busy,
    now: datetime | None = None,
    public: Mapping[str, float] | None = None,
    holds: frozenset[str] = frozenset(),
) -> Candidate:
    inventory = node.inventory or {}
    gpus = gpus_of(inventory)
    health = gpu_health.report_of(node)
    # where NVML reports, it decides what is offered: its ok GPUs, never more than the inventory lists
    offered = min(len(gpus), health.offered()) if health and health.gpus else len(gpus)
    vcpus = _vcpus(inventory)
    failing = failed_rules(node.requirements or {})
    region = node.region
    return Candidate(
        source=CandidateSource.NODE.value,
        id=node.id,
        name=node.name,
        region=region.name,
        region_account_id=region.account_id,
        region_public_jobs=bool(region.public_jobs),
        provider=region.provider.kind,
        gpu_type=gpu_type_of(inventory),
        gpus_total=offered,
        gpus_free=max(0, offered - busy.gpus),
        vcpus=vcpus,
        memory_gib=round(int(inventory.get("memory_total_bytes") or 0) / GIB, 2),
        price_per_gpu_hour=price_of(region.settings, inventory, public or {}),
        state=node.state,
        online=is_online(node.last_heartbeat_at, now),
        requirements_ok=not failing and (node.requirements or {}).get("ok") is not False,
        failed_rules=tuple(failing),
        vcpus_free=max(0, vcpus - busy.vcpus),
        holds=holds,
        gpu_failed=health.out_of_placement() if health else None,
        gpus_unoffered=len(gpus) - offered,
        unoffered_why=f"the node has no CDI spec: {health.cdi_problem}"
        if health and health.cdi_problem
        else UNOFFERED_WHY,
    )


def node_candidates(session: Session, now: datetime | None = None) -> list[Candidate]:
    """Every live compute node as a candidate (the storage node serves its region, never jobs; a GCP burst
    VM's node serves only the job it was made for, which is assigned to it when it is made)."""
    nodes = session.scalars(
        select(Node).where(
            Node.state != NodeState.REMOVED,
            Node.service == Service.COMPUTE.value,
            Node.id.not_in(select(GcpBurstVm.node_id)),
        )
    )
    busy = busy_by_node(session)
    public = {row.gpu_type: float(row.price_per_gpu_hour) for row in prices.list_prices(session)}
    regional = node_caches.region_caches(session)  # a central region's nodes read its storage node's

    def holds(n: Node) -> frozenset[str]:
        central = n.region.storage_mode == StorageMode.CENTRAL.value
        return regional.get(n.region_id, frozenset()) if central else node_caches.held_by(n)

    return [candidate_of(n, busy.get(n.id, Busy()), now, public, holds(n)) for n in nodes]


# The capacity sources placement chooses from, each giving its candidates from the store: the seam of
# domain.placement.CapacitySource on the store's side. GCP burst capacity (GCP candidates, from the
# cached quota: services.gcp_capacity) competes with owned nodes; ranking, rejections, match table are shared.
SOURCES: list[Callable[[Session], Iterable[Candidate]]] = [node_candidates, gcp_capacity.gcp_candidates]


def snapshot(session: Session) -> list[Candidate]:
    """What every capacity source offers now, as one list for `domain.placement.place`."""
    return [c for source in SOURCES for c in source(session)]


def take_all(
    candidates: list[Candidate], placed: Sequence[tuple[Candidate, PlacementRequest]]
) -> list[Candidate]:
    """The snapshot after every (candidate, request) worker in `placed` went there: one pass over the
    snapshot however many workers (a gang of 64 over 10,000 nodes), not one per worker."""
    taken: dict[tuple[str, str], list[int]] = {}
    for cand, request in placed:
        held = taken.setdefault((cand.source, cand.id), [0, 0])
        held[0] += request.gpu_count
        held[1] += 0 if request.gpu_count else request.cpu_count
    if not taken:
        return candidates
    out: list[Candidate] = []
    for c in candidates:
        gpus, vcpus = taken.get((c.source, c.id), (0, 0))
        if gpus or vcpus:
            c = replace(c, gpus_free=c.gpus_free - gpus, vcpus_free=c.free_vcpus - vcpus)
        out.append(c)
    return out
