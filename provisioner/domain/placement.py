"""Where a job can run: one pure function from a request and a snapshot of candidates (nodes today,
ephemeral cloud capacity later) to the candidates that fit, best first, and the reason every other one
was rejected. No store, no I/O: `services.job_placement` builds the snapshot, this module decides.

Rules (docs/placement.md):
- a candidate is rejected for the FIRST check it fails, in `PRECEDENCE` order: what no waiting can fix
  (region, account, GPU type, price, hardware) comes before what changes by itself (state, heartbeat,
  free capacity), so the reason tells the user whether waiting helps;
- the ranking puts the job's own account's regions first (a region owner's jobs always prefer its
  regions, cloudbender's "Allow Public Jobs"), then the cheapest price per GPU-hour, then (for a job
  with data) the candidate that already holds most of its objects, in its own cache or its region's
  (docs/data.md), then the most free capacity, then name and id so the answer never depends on the
  snapshot's order.

The loop is written out (no predicate per rule) because a decision over 10,000 candidates must take
< 10 ms (bench/bench_placement.py); the order it checks in is `PRECEDENCE`, which a test holds it to.
Messages are formatted only when read (`Placement.rejected`, `closest(n)`), since a scheduler needs
the reasons' kinds, not 10,000 sentences."""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import cached_property
from typing import Any, Final, NamedTuple, Protocol

from provisioner.domain.states import NodeState


class CandidateSource(StrEnum):
    """Where a candidate comes from; each kind is one `CapacitySource`."""

    NODE = "node"  # an enrolled node of a region (physical or lab)
    GCP = "gcp"  # an ephemeral cloud node that would be created for the job (the GCP jobs issue)


@dataclass(frozen=True, slots=True)
class PlacementRequest:
    """What a job needs, as placement sees it.

    gpu_types: catalogue names; empty = any type. gpu_count 0 = a CPU-only job, which asks for
    cpu_count vCPUs instead. max_price: credits per GPU-hour, None = no limit. region: the region the
    job must run in (its spec's `region`, or the region of a datastore/reservation it uses), and
    region_reason the words for why (e.g. "datastore 'imagenet'"; None = the spec's own `region`)."""

    account_id: str
    gpu_types: frozenset[str]
    gpu_count: int
    cpu_count: int = 0
    max_price: float | None = None
    region: str | None = None
    region_reason: str | None = None
    # False when the job's account has no credits (balance <= 0): it may not start on public capacity
    # (another account's region) and waits there with NO_CREDITS (docs/billing.md)
    public_credit: bool = True
    # the job's spec says `preemptible: true`: Spot capacity (Candidate.preemptible) may take it
    preemptible: bool = False
    # the digests of the datasets, models and checkpoints it mounts: a candidate holding them ranks first
    # among those of its price (Candidate.holds)
    data: frozenset[str] = frozenset()


# why GPUs a node has are not offered, unless it says otherwise (contracts/gpu_health.py: lost, busy)
UNOFFERED_WHY: Final = "lost or held outside rigbase"


@dataclass(frozen=True, slots=True)
class Candidate:
    """One place a job could run, as the capacity source saw it when the snapshot was taken.

    region_account_id: the account owning the region (None: unknown, treated as another account's).
    price_per_gpu_hour: the price the job would be charged (locked at job creation by the caller).
    state: a NodeState value (ephemeral cloud candidates are ACTIVE: they exist once asked for).
    requirements_ok: the node passes the hardware rules that apply to THIS request (the public-jobs
    rules apply when the job's account does not own the region); failed_rules names those it fails.
    vcpus_free: vCPUs not taken by running jobs; None = all of `vcpus`."""

    source: str
    id: str
    name: str
    region: str
    region_account_id: str | None
    region_public_jobs: bool
    provider: str
    gpu_type: str | None
    gpus_total: int
    gpus_free: int
    vcpus: int
    memory_gib: float
    price_per_gpu_hour: float
    state: str
    online: bool
    requirements_ok: bool
    failed_rules: tuple[str, ...] = ()
    vcpus_free: int | None = None
    # Spot capacity (a GCP Spot VM): only jobs that say `preemptible: true` may use it
    # (services.job_placement.allowed leaves it out of the others' snapshot)
    preemptible: bool = False
    # the object digests it would read without fetching: its own cache's, or its region's storage node's
    holds: frozenset[str] = frozenset()
    # its GPUs as its NVML reports them (contracts/gpu_health.py): why a failed GPU takes it out (None: none
    # failed), and how many of its GPUs are not offered (lost, or held by a process outside rigbase): those
    # are already left out of gpus_total and gpus_free
    gpu_failed: str | None = None
    gpus_unoffered: int = 0
    unoffered_why: str = UNOFFERED_WHY  # or the node's own reason (it has no CDI spec)

    @property
    def free_vcpus(self) -> int:
        return self.vcpus if self.vcpus_free is None else self.vcpus_free


class Rejection(StrEnum):
    """Why a candidate does not take the job. Each has a short label (counts, `summary`) and a one-line
    template saying what would make it fit (`message`)."""

    REGION_PINNED = "region_pinned"
    PUBLIC_JOBS_OFF = "public_jobs_off"
    NO_CREDITS = "no_credits"
    WRONG_GPU_TYPE = "wrong_gpu_type"
    OVER_MAX_PRICE = "over_max_price"
    HARDWARE_RULES = "hardware_rules"
    GPU_FAILED = "gpu_failed"
    NOT_ACTIVE = "not_active"
    MAINTENANCE = "maintenance"
    OFFLINE = "offline"
    TOO_FEW_GPUS = "too_few_gpus"
    TOO_FEW_CPUS = "too_few_cpus"

    @property
    def label(self) -> str:
        return TEXTS[self].label

    @property
    def template(self) -> str:
        return TEXTS[self].template

    def message(self, request: PlacementRequest, candidate: Candidate) -> str:
        """The one-line reason for `candidate`, saying what would make it fit."""
        return TEXTS[self].template.format(**_fields(request, candidate))


class RejectionText(NamedTuple):
    label: str
    template: str


# Placeholders: every field of `_fields`. Each sentence ends with what would make the candidate fit.
TEXTS: dict[Rejection, RejectionText] = {
    Rejection.REGION_PINNED: RejectionText(
        "region pinned",
        "in region {region}, but the job must run in {pinned} ({pinned_by}): "
        "use resources of {region} instead to run here",
    ),
    Rejection.PUBLIC_JOBS_OFF: RejectionText(
        "public jobs off",
        "region {region} belongs to another account and does not take public jobs: "
        "its owner can allow public jobs",
    ),
    Rejection.NO_CREDITS: RejectionText(
        "no credits",
        "region {region} belongs to another account and this account's balance is not above 0: "
        "runs here once the account has credits (`provision billing balance`)",
    ),
    Rejection.WRONG_GPU_TYPE: RejectionText(
        "wrong GPU type",
        "has {gpu_type} GPUs, the job asks for {wanted}: add '{gpu_type}' to resources.gpu_types to use it",
    ),
    Rejection.OVER_MAX_PRICE: RejectionText(
        "over max price",
        "costs {price:.2f} per GPU-hour, over the job's max_price {max_price:.2f}: "
        "raise resources.max_price to {price:.2f} to use it",
    ),
    Rejection.HARDWARE_RULES: RejectionText(
        "hardware rules",
        "fails the hardware rules that apply to this job ({failed}): `minion check` on it says what to fix",
    ),
    Rejection.GPU_FAILED: RejectionText(
        "GPU failed",
        "has a failed GPU ({gpu_failed}): takes jobs again once it is reset or replaced and its minion "
        "reports it healthy (`provision node show {name}`)",
    ),
    Rejection.NOT_ACTIVE: RejectionText(
        "not active",
        "is {state}: takes jobs once it is active",
    ),
    Rejection.MAINTENANCE: RejectionText(
        "in maintenance",
        "is in maintenance: takes jobs again after `provision node maintenance {name} off`",
    ),
    Rejection.OFFLINE: RejectionText(
        "offline",
        "is offline (no recent heartbeat): takes jobs again when its minion reports",
    ),
    Rejection.TOO_FEW_GPUS: RejectionText(
        "too few free GPUs",
        "has {gpus_free} of {gpus_total} GPUs free{unoffered}, the job needs {gpu_count}: "
        "fits when enough are free, or with a lower resources.gpu_count",
    ),
    Rejection.TOO_FEW_CPUS: RejectionText(
        "too few CPUs",
        "has {vcpus_free} of {vcpus} vCPUs free, the CPU-only job needs {cpu_count}: "
        "fits when enough are free, or with a lower resources.cpu_count",
    ),
}

# The order `place` checks in: a candidate gets the first reason that applies. Reasons no waiting
# fixes come first; the last ones clear by themselves (a node comes back, a job ends).
PRECEDENCE: tuple[Rejection, ...] = (
    Rejection.REGION_PINNED,
    Rejection.PUBLIC_JOBS_OFF,
    Rejection.NO_CREDITS,
    Rejection.WRONG_GPU_TYPE,
    Rejection.OVER_MAX_PRICE,
    Rejection.HARDWARE_RULES,
    Rejection.GPU_FAILED,
    Rejection.NOT_ACTIVE,
    Rejection.MAINTENANCE,
    Rejection.OFFLINE,
    Rejection.TOO_FEW_GPUS,
    Rejection.TOO_FEW_CPUS,
)
# Reasons that clear without anyone changing the job (the job waits rather than being refused).
TRANSIENT: frozenset[Rejection] = frozenset(
    {
        Rejection.NO_CREDITS,
        Rejection.GPU_FAILED,  # a reset or a replaced GPU brings the node back, the job unchanged
        Rejection.NOT_ACTIVE,
        Rejection.MAINTENANCE,
        Rejection.OFFLINE,
        Rejection.TOO_FEW_GPUS,
        Rejection.TOO_FEW_CPUS,
    }
)


def _fields(request: PlacementRequest, c: Candidate) -> dict[str, object]:
    return {
        "name": c.name,
        "region": c.region,
        "pinned": request.region,
        "pinned_by": request.region_reason or "the job's region",
        "gpu_type": c.gpu_type or "no",
        "wanted": " or ".join(sorted(request.gpu_types)) or "any type",
        "price": c.price_per_gpu_hour,
        "max_price": request.max_price if request.max_price is not None else float("inf"),
        "failed": ", ".join(c.failed_rules) or "see `provision node show`",
        "state": c.state,
        "gpus_free": c.gpus_free,
        "gpus_total": c.gpus_total,
        "gpu_failed": c.gpu_failed,
        "unoffered": f" ({c.gpus_unoffered} more not offered: {c.unoffered_why})" if c.gpus_unoffered else "",
        "gpu_count": request.gpu_count,
        "vcpus_free": c.free_vcpus,
        "vcpus": c.vcpus,
        "cpu_count": request.cpu_count,
    }


@dataclass(frozen=True)
class Placement:
    """The decision. `ranked`: the fitting candidates, best first (`chosen` is ranked[0]). The rejected
    ones are `missed` with `missed_because[i]` the reason of `missed[i]` (two lists rather than pairs:
    10,000 small tuples per decision cost more than the decision). `rejected` / `closest(n)` give them
    with their messages, closest misses (latest in PRECEDENCE) first, then by name."""

    request: PlacementRequest
    ranked: list[Candidate]
    missed: list[Candidate] = field(default_factory=list)
    missed_because: list[Rejection] = field(default_factory=list)

    @property
    def chosen(self) -> Candidate | None:
        return self.ranked[0] if self.ranked else None

    @property
    def reasons(self) -> list[tuple[Candidate, Rejection]]:
        """(candidate, reason) for every rejected candidate, in the order they were checked."""
        return list(zip(self.missed, self.missed_because, strict=True))

    @cached_property
    def rejected(self) -> list[tuple[Candidate, Rejection, str]]:
        """(candidate, reason, message) for every rejected candidate, closest misses first."""
        return self.closest(None)

    def closest(self, limit: int | None = 10) -> list[tuple[Candidate, Rejection, str]]:
        """The `limit` closest misses (all with None) with their messages; formats only those."""
        buckets: dict[Rejection, list[Candidate]] = {}
        for c, r in zip(self.missed, self.missed_because, strict=True):
            buckets.setdefault(r, []).append(c)
        out: list[tuple[Candidate, Rejection, str]] = []
        for reason in reversed(PRECEDENCE):
            bucket = buckets.get(reason, [])
            room = len(bucket) if limit is None else min(len(bucket), limit - len(out))
            for c in (
                heapq.nsmallest(room, bucket, key=_by_name)
                if room < len(bucket)
                else sorted(bucket, key=_by_name)
            ):
                out.append((c, reason, reason.message(self.request, c)))
            if limit is not None and len(out) >= limit:
                break
        return out

    def counts(self) -> dict[Rejection, int]:
        """How many candidates each reason rejected, in PRECEDENCE order (reasons with none left out)."""
        seen = Counter(self.missed_because)
        return {r: seen[r] for r in PRECEDENCE if seen[r]}

    @property
    def waits(self) -> bool:
        """Nothing fits now, but something would without changing the job (capacity, a node back)."""
        return not self.ranked and not TRANSIENT.isdisjoint(self.missed_because)

    def summary(self) -> str:
        """One line: where it goes, or (the `waiting` reason) why nothing fits, naming the closest miss."""
        total = len(self.ranked) + len(self.missed)
        if self.ranked:
            return f"fits {len(self.ranked)} of {total} candidates; best {self.ranked[0].name}"
        if not self.missed:
            return "no capacity this account can use: no node in its regions or in regions with public jobs"
        c, _, message = self.closest(1)[0]
        tally = ", ".join(f"{n} {r.label}" for r, n in self.counts().items())
        return f"none of {total} candidates fits ({tally}); closest: {c.name} {message}"


def _by_name(c: Candidate) -> tuple[str, str]:
    return (c.name, c.id)


def place(request: PlacementRequest, candidates: Iterable[Candidate]) -> Placement:
    """Rank the candidates that fit `request` and give every other one its reason (module docstring).
    For many decisions over one snapshot, `Fleet` gives the same answers without sorting each time."""
    own_fits, other_fits, missed, because = _check(request, candidates)
    key = _ranking_key(request)
    own_fits.sort(key=key)
    other_fits.sort(key=key)
    return Placement(request, _by_data(request, own_fits) + _by_data(request, other_fits), missed, because)


def held_share(request: PlacementRequest, c: Candidate) -> int:
    """How many of the job's objects the candidate holds already."""
    return len(request.data & c.holds) if request.data else 0


def _by_data(request: PlacementRequest, fits: list[Candidate]) -> list[Candidate]:
    """`fits` (ranked) with the candidates holding more of the job's data first among those of one price
    (a stable sort: the rest of the ranking stays)."""
    if not request.data:
        return fits
    if request.gpu_count > 0:
        return sorted(fits, key=lambda c: (c.price_per_gpu_hour, -held_share(request, c)))
    return sorted(fits, key=lambda c: -held_share(request, c))


def _ranking_key(request: PlacementRequest) -> Callable[[Candidate], tuple[Any, ...]]:
    """The ranking after "own regions first" (which `_check` does by splitting): it depends on the
    request only through the job's kind, so `Fleet` can sort by it once per snapshot."""
    return _gpu_job_key if request.gpu_count > 0 else _cpu_job_key


def _gpu_job_key(c: Candidate) -> tuple[float, int, int, str, str]:
    """Cheapest, then most free GPUs, then most free vCPUs, then name and id (determinism)."""
    return (
        c.price_per_gpu_hour,
        -c.gpus_free,
        -(c.vcpus if c.vcpus_free is None else c.vcpus_free),
        c.name,
        c.id,
    )


def _cpu_job_key(c: Candidate) -> tuple[int, int, str, str]:
    """Fewest idle GPUs first (a CPU-only job pays no GPU-hour price and leaves GPU capacity to GPU
    jobs), then most free vCPUs, then name and id."""
    return (c.gpus_free, -(c.vcpus if c.vcpus_free is None else c.vcpus_free), c.name, c.id)


def _check(  # noqa: C901
    request: PlacementRequest, candidates: Iterable[Candidate]
) -> tuple[list[Candidate], list[Candidate], list[Candidate], list[Rejection]]:
    """One pass: fits in own regions, fits elsewhere (both in input order), rejected and their reasons."""
    own = request.account_id
    pinned = request.region
    gpu_job = request.gpu_count > 0
    wanted = request.gpu_types if gpu_job and request.gpu_types else None
    max_price = request.max_price if gpu_job else None
    need_gpus = request.gpu_count
    need_cpus = request.cpu_count
    public_credit = request.public_credit
    active, maintenance = NodeState.ACTIVE, NodeState.MAINTENANCE
    own_fits: list[Candidate] = []
    other_fits: list[Candidate] = []
    missed: list[Candidate] = []
    because: list[Rejection] = []
    miss, why = missed.append, because.append
    # The checks below are PRECEDENCE, in order (tests/provisioner/test_placement.py holds them to it).
    reason: Rejection
    for c in candidates:
        if pinned is not None and c.region != pinned:
            reason = Rejection.REGION_PINNED
        elif c.region_account_id != own and not c.region_public_jobs:
            reason = Rejection.PUBLIC_JOBS_OFF
        elif c.region_account_id != own and not public_credit:
            reason = Rejection.NO_CREDITS
        elif wanted is not None and c.gpu_type not in wanted:
            reason = Rejection.WRONG_GPU_TYPE
        elif max_price is not None and c.price_per_gpu_hour > max_price:
            reason = Rejection.OVER_MAX_PRICE
        elif not c.requirements_ok:
            reason = Rejection.HARDWARE_RULES
        elif c.gpu_failed is not None:
            reason = Rejection.GPU_FAILED
        elif c.state != active:
            reason = Rejection.MAINTENANCE if c.state == maintenance else Rejection.NOT_ACTIVE
        elif not c.online:
            reason = Rejection.OFFLINE
        elif c.gpus_free < need_gpus:
            reason = Rejection.TOO_FEW_GPUS
        elif not gpu_job and (c.vcpus if c.vcpus_free is None else c.vcpus_free) < need_cpus:
            reason = Rejection.TOO_FEW_CPUS
        else:
            (own_fits if c.region_account_id == own else other_fits).append(c)
            continue
        miss(c)
        why(reason)
    return own_fits, other_fits, missed, because


class Fleet:
    """A snapshot prepared for many decisions (a scheduler pass placing the waiting jobs): the
    candidates are sorted once per job kind by `_ranking_key`, so each `place` is one pass and no sort,
    with the same answer as `place(request, candidates)`. `take` books capacity for a placed job and
    keeps the order, so the next decision sees it. In memory only; build a new one per pass."""

    def __init__(self, candidates: Iterable[Candidate]) -> None:
        items = list(candidates)
        self._orders: dict[Callable[[Candidate], tuple[Any, ...]], list[Candidate]] = {
            _gpu_job_key: sorted(items, key=_gpu_job_key),
            _cpu_job_key: sorted(items, key=_cpu_job_key),
        }

    def __len__(self) -> int:
        return len(self._orders[_gpu_job_key])

    @property
    def candidates(self) -> list[Candidate]:
        return list(self._orders[_gpu_job_key])

    def place(self, request: PlacementRequest) -> Placement:
        own_fits, other_fits, missed, because = _check(request, self._orders[_ranking_key(request)])
        return Placement(
            request, _by_data(request, own_fits) + _by_data(request, other_fits), missed, because
        )

    def take(self, candidate: Candidate, gpus: int, vcpus: int = 0) -> Candidate:
        """Book `gpus` GPUs and `vcpus` vCPUs of `candidate` (as found in this fleet) for a placed job;
        returns the candidate as it is now. ValueError when it is not in the fleet or lacks them."""
        if gpus > candidate.gpus_free or vcpus > candidate.free_vcpus:
            raise ValueError(
                f"{candidate.name} has {candidate.gpus_free} GPUs and {candidate.free_vcpus} vCPUs free"
            )
        after = replace(
            candidate, gpus_free=candidate.gpus_free - gpus, vcpus_free=candidate.free_vcpus - vcpus
        )
        for key, order in self._orders.items():
            at = bisect_left(order, key(candidate), key=key)
            if at == len(order) or order[at] != candidate:
                raise ValueError(f"{candidate.name} ({candidate.id}) is not in this fleet as given")
            del order[at]
            insort(order, after, key=key)
        return after


def place_queue(requests: Sequence[PlacementRequest], fleet: Fleet) -> list[Placement]:
    """Place waiting jobs (oldest first) on one snapshot, booking each chosen candidate's capacity in
    `fleet` so two jobs never get the same GPUs. A region owner's jobs are always preferred in its
    regions (cloudbender, Regions): a first pass gives each job a place in its own account's regions,
    and only then do the others compete for what is left. Returns one Placement per request, in order;
    its `chosen` is where that job goes (None: it waits, `summary()` says why)."""
    out: list[Placement | None] = [None] * len(requests)
    for i, request in enumerate(requests):
        first = fleet.place(request)
        if first.chosen is not None and first.chosen.region_account_id == request.account_id:
            out[i] = _booked(fleet, first)
    for i, request in enumerate(requests):
        if out[i] is None:
            out[i] = _booked(fleet, fleet.place(request))
    return [p for p in out if p is not None]


def _booked(fleet: Fleet, placement: Placement) -> Placement:
    """`placement` with its chosen candidate's capacity taken in `fleet` (shown as it was before)."""
    if placement.chosen is not None:
        request = placement.request
        fleet.take(placement.chosen, request.gpu_count, 0 if request.gpu_count else request.cpu_count)
    return placement


def gpu_types_in_region(candidates: Iterable[Candidate], region: str) -> frozenset[str]:
    """Every GPU type any candidate of `region` has, whatever its state (what exists there)."""
    return frozenset(c.gpu_type for c in candidates if c.region == region and c.gpu_type)


def refusal_at_create(request: PlacementRequest, candidates: Sequence[Candidate]) -> str | None:
    """A job pinned to a region asking only for GPU types that region does not have can never run:
    refuse it when it is created (cloudbender, Regional Resources) instead of letting it wait forever.
    None when it may wait; otherwise one line saying what to do."""
    if request.region is None or request.gpu_count == 0 or not request.gpu_types:
        return None
    there = gpu_types_in_region(candidates, request.region)
    if request.gpu_types & there:
        return None
    why = request.region_reason or "the job's region"
    have = ", ".join(sorted(there)) or "no GPUs"
    wanted = " or ".join(sorted(request.gpu_types))
    return (
        f"region {request.region} ({why}) has {have}, not {wanted}: "
        f"ask for a GPU type of {request.region} or use resources of another region"
    )


class CapacitySource(Protocol):
    """A kind of capacity placement can choose from. Nodes are one source; the GCP jobs issue adds
    ephemeral cloud nodes as another, each answering with Candidates (source=CandidateSource.GCP)."""

    def candidates(self, request: PlacementRequest) -> Iterable[Candidate]: ...


@dataclass(frozen=True)
class Snapshot:
    """A fixed list of candidates (a fleet snapshot taken by the caller) as a CapacitySource."""

    items: Sequence[Candidate]

    def candidates(self, request: PlacementRequest) -> Iterable[Candidate]:
        return self.items


def place_from(request: PlacementRequest, sources: Iterable[CapacitySource]) -> Placement:
    """`place` over every source's candidates together, so a cloud node competes on the same rules."""
    return place(request, [c for source in sources for c in source.candidates(request)])
