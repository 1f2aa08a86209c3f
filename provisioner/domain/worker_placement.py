"""Placing a job's workers: one pure function from the request of each worker and a fleet snapshot to the
candidate each worker goes to (docs/placement.md "Workers, gangs and regions").

- A job runs in **one region**: its workers reach each other over the region's private network, and its
  region's owner is the one it pays or earns. The region is the best ranked one (domain.placement's
  order: own regions, then price) where the job fits.
- A **gang** job is placed whole or waits whole. An **independent** job places what fits now; its other
  workers wait and are placed as capacity frees (in the region the first ones went to).
- Workers of one request are packed onto the ranked candidates in order, as many to a candidate as it
  holds: one pass over the ranking per group of alike workers, not one placement per worker, so a gang of
  64 over 10,000 nodes costs a few single placements (bench/bench_placement.py).
- **Never**: a job that would not fit even on an empty fleet (every node as large as it is, active,
  online, nothing running) is `unplaceable`; `never_reason` says why and what would make it fit, instead of
  "fits when enough are free"."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from provisioner.domain.placement import TRANSIENT, Candidate, Placement, PlacementRequest, place
from provisioner.domain.states import NodeState

UNPLACEABLE = "Unplaceable"  # the reason's first word for a job the fleet can never hold as it is


@dataclass(frozen=True)
class Packing:
    """The decision for the workers asked (`requests[i]` is worker `workers[i]`): `chosen[i]` its
    candidate or None (it waits). `placements`: each distinct request's placement (the match table is the
    first's). `region`: where they went (None: nothing placed). `fit_now`: the most of them one region
    holds now (what a gang that waits whole says)."""

    workers: list[int]
    chosen: list[Candidate | None]
    placements: dict[PlacementRequest, Placement]
    region: str | None
    fit_now: int = 0

    @property
    def placed(self) -> list[tuple[int, Candidate]]:
        return [(w, c) for w, c in zip(self.workers, self.chosen, strict=True) if c is not None]

    @property
    def complete(self) -> bool:
        return all(c is not None for c in self.chosen)


def _need(request: PlacementRequest) -> tuple[int, int]:
    """(GPUs, vCPUs) one worker of `request` takes from a candidate (a GPU job's CPUs come with its GPUs)."""
    return request.gpu_count, (0 if request.gpu_count else request.cpu_count)


def _regions(order: Sequence[Placement]) -> list[str]:
    """The regions of the ranked fits, best first: the first request's ranking, then the others'."""
    seen: dict[str, None] = {}
    for placement in order:
        for c in placement.ranked:
            seen.setdefault(c.region, None)
    return list(seen)


Ranked = dict[PlacementRequest, dict[str, list[Candidate]]]  # request -> region -> its fits, best first


def _by_region(placements: dict[PlacementRequest, Placement]) -> Ranked:
    """Each request's ranked fits split by region once, keeping their order."""
    out: Ranked = {}
    for request, placement in placements.items():
        regions: dict[str, list[Candidate]] = {}
        for c in placement.ranked:
            regions.setdefault(c.region, []).append(c)
        out[request] = regions
    return out


def _fill(
    workers: Sequence[int], requests: Sequence[PlacementRequest], by_region: Ranked, region: str
) -> list[Candidate | None]:
    """Pack the workers onto their request's ranked fits in `region`, in order, booking capacity as they
    go (a candidate two requests share is booked once). A pointer per request: a candidate too full for
    one more worker of a request stays too full for it."""
    free: dict[tuple[str, str], list[int]] = {}
    at: dict[PlacementRequest, int] = {}
    ranked = {r: regions.get(region, []) for r, regions in by_region.items()}
    out: list[Candidate | None] = []
    for _worker, request in zip(workers, requests, strict=True):
        gpus, vcpus = _need(request)
        fits = ranked[request]
        i = at.get(request, 0)
        chosen: Candidate | None = None
        while i < len(fits):
            c = fits[i]
            left = free.setdefault((c.source, c.id), [c.gpus_free, c.free_vcpus])
            if left[0] >= gpus and left[1] >= vcpus:
                left[0] -= gpus
                left[1] -= vcpus
                chosen = c
                break
            i += 1
        at[request] = i
        out.append(chosen)
    return out


def pack(
    workers: Sequence[int],
    requests: Sequence[PlacementRequest],
    candidates: Sequence[Candidate] | Mapping[PlacementRequest, Sequence[Candidate]],
    *,
    whole: bool,
    region: str | None = None,
) -> Packing:
    """Place `workers` (their numbers; `requests[i]` is what worker `workers[i]` needs) on `candidates`
    (or on each request's own view of them). `whole`: all or none (a gang). `region`: the region the job
    already runs in (its placed workers')."""
    placements: dict[PlacementRequest, Placement] = {}
    for request in requests:
        if request not in placements:
            view = candidates[request] if isinstance(candidates, Mapping) else candidates
            placements[request] = place(request, view)
    order = list(placements.values())
    regions = [region] if region is not None else _regions(order)
    by_region = _by_region(placements)
    best: tuple[int, str | None, list[Candidate | None]] = (0, None, [None] * len(workers))
    for name in regions:
        chosen = _fill(workers, requests, by_region, name)
        count = sum(c is not None for c in chosen)
        if count == len(workers):
            return Packing(list(workers), chosen, placements, name, count)
        if count > best[0]:
            best = (count, name, chosen)
    if whole or best[1] is None:
        return Packing(list(workers), [None] * len(workers), placements, None, best[0])
    return Packing(list(workers), best[2], placements, best[1], best[0])


def _emptied(c: Candidate) -> Candidate:
    """The candidate as it could be: active, online, with nothing running on it (written out: 10,000
    dataclasses.replace calls cost more than the decision)."""
    return Candidate(
        source=c.source,
        id=c.id,
        name=c.name,
        region=c.region,
        region_account_id=c.region_account_id,
        region_public_jobs=c.region_public_jobs,
        provider=c.provider,
        gpu_type=c.gpu_type,
        gpus_total=c.gpus_total,
        gpus_free=c.gpus_total,
        vcpus=c.vcpus,
        memory_gib=c.memory_gib,
        price_per_gpu_hour=c.price_per_gpu_hour,
        state=NodeState.ACTIVE.value,
        online=True,
        requirements_ok=c.requirements_ok,
        failed_rules=c.failed_rules,
        vcpus_free=c.vcpus,
        preemptible=c.preemptible,
    )


def as_empty(candidates: Sequence[Candidate]) -> list[Candidate]:
    """The fleet as it could be: every candidate active, online, with nothing running on it."""
    return [_emptied(c) for c in candidates]


def eligible(request: PlacementRequest, candidates: Sequence[Candidate]) -> list[Candidate]:
    """The candidates `request` could use once what clears by itself has (a node back, capacity freed,
    credits): those that fit now and those rejected only for a TRANSIENT reason, emptied."""
    placement = place(request, candidates)
    return as_empty(placement.ranked + [c for c, r in placement.reasons if r in TRANSIENT])


def never_reason(
    requests: Sequence[PlacementRequest], candidates: Sequence[Candidate], *, whole: bool
) -> str | None:
    """Why the fleet can never hold the job as it is (None: it can, or nothing could be said: no node is
    eligible at all, e.g. no node of its GPU type yet, which a joining node may change). A gang must fit
    whole in one region of the empty fleet; an independent job's every worker must fit on some node."""
    # as things could be: the account with credits too (NO_CREDITS clears when it is topped up)
    requests = [replace(r, public_credit=True) for r in requests]
    distinct = list(dict.fromkeys(requests))
    usable = {r: eligible(r, candidates) for r in distinct}
    if any(not usable[r] for r in distinct):
        return None  # rejected for what a new node may bring (type, price, rules): the usual reasons
    for request in distinct:
        largest = max(usable[request], key=lambda c: (_size(request, c), c.name))
        if _size(request, largest) < _amount(request):
            return (
                f"{UNPLACEABLE}: no node {_of(request)} can hold one worker of {_amount(request)} "
                f"{_unit(request)}; the largest, {largest.name} ({largest.region}), has "
                f"{_size(request, largest)}: ask for at most {_size(request, largest)} {_unit(request)} "
                f"per worker ({_field(request)}), or add a larger node"
            )
    if not whole or pack(range(len(requests)), requests, usable, whole=True).complete:
        return None  # every worker fits a node of its own; a gang fits one region of the empty fleet
    totals: dict[str, int] = {}
    for request in distinct:
        for c in usable[request]:
            totals[c.region] = totals.get(c.region, 0) + _size(request, c)
    region, has = max(totals.items(), key=lambda kv: (kv[1], kv[0]))
    need = sum(_amount(r) for r in requests)
    return (
        f"{UNPLACEABLE}: the gang's {len(requests)} workers need {need} {_unit(requests[0])} in one "
        f"region; the largest region for them, {region}, has {has} in all: use fewer or smaller workers, "
        "make it an independent job, or add nodes to one region"
    )


def _size(request: PlacementRequest, c: Candidate) -> int:
    return c.gpus_total if request.gpu_count else c.vcpus


def _amount(request: PlacementRequest) -> int:
    return request.gpu_count or request.cpu_count


def _unit(request: PlacementRequest) -> str:
    return "GPUs" if request.gpu_count else "vCPUs"


def _field(request: PlacementRequest) -> str:
    return "resources.gpu_count" if request.gpu_count else "resources.cpu_count"


def _of(request: PlacementRequest) -> str:
    if request.gpu_count and request.gpu_types:
        return "of " + " or ".join(sorted(request.gpu_types))
    return "this job may use"
