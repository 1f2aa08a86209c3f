"""Placement (provisioner/domain/placement.py): every rejection reason with its message, the order the
checks run in, the ranking rules, determinism, the prepared Fleet agreeing with `place`, capacity
booking, the region owner's preference across a queue, the create-time refusal, the capacity-source
seam and the dry-run match table. Pure functions: no store, no server."""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from provisioner.domain.placement import (
    PRECEDENCE,
    TEXTS,
    TRANSIENT,
    Candidate,
    CandidateSource,
    Fleet,
    Placement,
    PlacementRequest,
    Rejection,
    Snapshot,
    place,
    place_from,
    place_queue,
    refusal_at_create,
)
from provisioner.domain.placement_rows import MATCH_HEADERS, SELECTED_MARK, match_rows
from provisioner.domain.states import NodeState

OWN, OTHER = "acc_own", "acc_other"


def node(name: str = "n1", **over: Any) -> Candidate:
    """A candidate that fits `job()`; each test changes what it is about."""
    fields: dict[str, Any] = {
        "source": CandidateSource.NODE,
        "id": f"id-{name}",
        "name": name,
        "region": "lab",
        "region_account_id": OWN,
        "region_public_jobs": False,
        "provider": "physical",
        "gpu_type": "A100",
        "gpus_total": 8,
        "gpus_free": 8,
        "vcpus": 64,
        "memory_gib": 512.0,
        "price_per_gpu_hour": 1.0,
        "state": NodeState.ACTIVE,
        "online": True,
        "requirements_ok": True,
    }
    fields.update(over)
    return Candidate(**fields)


def job(**over: Any) -> PlacementRequest:
    fields: dict[str, Any] = {"account_id": OWN, "gpu_types": frozenset({"A100"}), "gpu_count": 2}
    fields.update(over)
    return PlacementRequest(**fields)


CPU_JOB: dict[str, Any] = {"gpu_types": frozenset(), "gpu_count": 0, "cpu_count": 16}

# reason → (candidate changes, request changes, words the message must contain: the fix)
CASES: dict[Rejection, tuple[dict[str, Any], dict[str, Any], str]] = {
    Rejection.REGION_PINNED: (
        {"region": "east"},
        {"region": "lab", "region_reason": "datastore 'imagenet'"},
        "must run in lab (datastore 'imagenet')",
    ),
    Rejection.PUBLIC_JOBS_OFF: ({"region_account_id": OTHER}, {}, "its owner can allow public jobs"),
    Rejection.NO_CREDITS: (
        {"region_account_id": OTHER, "region_public_jobs": True},
        {"public_credit": False},
        "once the account has credits",
    ),
    Rejection.WRONG_GPU_TYPE: ({"gpu_type": "T4"}, {}, "add 'T4' to resources.gpu_types"),
    Rejection.OVER_MAX_PRICE: (
        {"price_per_gpu_hour": 2.5},
        {"max_price": 2.0},
        "raise resources.max_price to 2.50",
    ),
    Rejection.HARDWARE_RULES: (
        {"requirements_ok": False, "failed_rules": ("memory-vs-vram",)},
        {},
        "(memory-vs-vram): `minion check`",
    ),
    Rejection.GPU_FAILED: (
        {"gpu_failed": "GPU 3 failed: uncorrectable ECC errors (2)"},
        {},
        "(GPU 3 failed: uncorrectable ECC errors (2)): takes jobs again once it is reset or replaced",
    ),
    Rejection.NOT_ACTIVE: ({"state": NodeState.PROVISIONING}, {}, "takes jobs once it is active"),
    Rejection.MAINTENANCE: ({"state": NodeState.MAINTENANCE}, {}, "`provision node maintenance n1 off`"),
    Rejection.OFFLINE: ({"online": False}, {}, "when its minion reports"),
    Rejection.TOO_FEW_GPUS: ({"gpus_free": 1}, {}, "has 1 of 8 GPUs free, the job needs 2"),
    Rejection.TOO_FEW_CPUS: ({"vcpus_free": 8}, CPU_JOB, "has 8 of 64 vCPUs free, the CPU-only job needs 16"),
}


def test_every_reason_has_a_case_a_label_and_a_place_in_the_order() -> None:
    assert set(CASES) == set(Rejection) == set(TEXTS) == set(PRECEDENCE)
    assert len(PRECEDENCE) == len(set(PRECEDENCE))
    assert TRANSIENT <= set(Rejection)


@pytest.mark.parametrize("reason", list(Rejection))
def test_each_rejection_reason_with_a_one_line_message_saying_what_would_fit(reason: Rejection) -> None:
    cand_over, req_over, fix = CASES[reason]
    request = job(**req_over)
    assert place(request, [node()]).chosen is not None, "the baseline candidate fits"
    placement = place(request, [node(**cand_over)])
    assert placement.ranked == []
    assert placement.reasons == [(node(**cand_over), reason)]
    [(_, got, message)] = placement.rejected
    assert got is reason
    assert fix in message, message
    assert "\n" not in message and ": " in message
    assert placement.counts() == {reason: 1}
    assert placement.waits == (reason in TRANSIENT)
    summary = placement.summary()
    assert summary.startswith(f"none of 1 candidates fits (1 {reason.label}); closest: n1 ")
    assert fix in summary


def test_checks_run_in_precedence_order() -> None:
    """A candidate failing every check gets the first reason of PRECEDENCE; mending that one reveals
    the next, and so on: the written-out loop in `_check` is the data in PRECEDENCE."""

    def sequence(request: PlacementRequest, reasons: Iterable[Rejection]) -> list[Rejection]:
        reasons = list(reasons)
        broken: dict[str, Any] = {}
        for r in reasons:
            broken.update(CASES[r][0])
        broken.pop("failed_rules", None)
        seen = []
        mend = node()
        for r in reasons:
            got = place(request, [node(**broken)]).reasons
            seen.append(got[0][1])
            for key in CASES[r][0]:
                broken[key] = getattr(mend, key)
        assert place(request, [node(**broken)]).chosen is not None
        return seen

    # not active and in maintenance are one check (the node's state), so each chain takes one of them
    one_state_check = (Rejection.NOT_ACTIVE, Rejection.MAINTENANCE)
    assert PRECEDENCE.index(Rejection.NOT_ACTIVE) + 1 == PRECEDENCE.index(Rejection.MAINTENANCE)
    pinned = {"region": "lab", "region_reason": "reservation 'nb'", "max_price": 2.0}
    cpu_only = {Rejection.WRONG_GPU_TYPE, Rejection.OVER_MAX_PRICE, Rejection.TOO_FEW_GPUS}
    # no credits is the request's side of a public region, exclusive with public jobs off: checked below
    for state_reason in one_state_check:
        skip = {r for r in one_state_check if r is not state_reason} | {Rejection.NO_CREDITS}
        gpu_reasons = [r for r in PRECEDENCE if r is not Rejection.TOO_FEW_CPUS and r not in skip]
        assert sequence(job(**pinned), gpu_reasons) == gpu_reasons
        cpu_reasons = [r for r in PRECEDENCE if r not in cpu_only and r not in skip]
        assert sequence(job(**CPU_JOB, region="lab"), cpu_reasons) == cpu_reasons
    broke = job(public_credit=False)
    public = {"region_account_id": OTHER, "region_public_jobs": True, "gpu_type": "T4", "online": False}
    assert place(broke, [node(**public)]).reasons[0][1] is Rejection.NO_CREDITS
    assert place(job(), [node(**public)]).reasons[0][1] is Rejection.WRONG_GPU_TYPE
    assert place(broke, [node()]).chosen is not None  # its own regions need no credits


def test_cpu_only_jobs_ignore_gpu_type_price_and_gpus() -> None:
    cand = node(gpu_type=None, gpus_total=0, gpus_free=0, price_per_gpu_hour=9.0)
    assert place(job(**CPU_JOB, max_price=0.1), [cand]).chosen == cand


def test_no_gpu_types_means_any_type_and_no_max_price_means_any_price() -> None:
    cand = node(gpu_type="H100", price_per_gpu_hour=99.0)
    assert place(job(gpu_types=frozenset()), [cand]).chosen == cand


def test_another_accounts_region_needs_public_jobs_and_unknown_owner_counts_as_another() -> None:
    public = node("pub", region_account_id=OTHER, region_public_jobs=True)
    private = node("priv", region_account_id=OTHER)
    orphan = node("orphan", region_account_id=None)
    placement = place(job(), [public, private, orphan])
    assert [c.name for c in placement.ranked] == ["pub"]
    assert {c.name: r for c, r in placement.reasons} == {
        "priv": Rejection.PUBLIC_JOBS_OFF,
        "orphan": Rejection.PUBLIC_JOBS_OFF,
    }
    # the owner's own jobs run on its private region
    assert place(job(account_id=OTHER), [private]).chosen == private


def test_ranking_own_regions_first_then_cheapest_then_most_free_then_name() -> None:
    cands = [
        node("foreign-cheap", region_account_id=OTHER, region_public_jobs=True, price_per_gpu_hour=0.1),
        node("own-dear", price_per_gpu_hour=3.0),
        node("own-cheap-b", price_per_gpu_hour=1.0, gpus_free=4),
        node("own-cheap-a", price_per_gpu_hour=1.0, gpus_free=4),
        node("own-cheap-roomy", price_per_gpu_hour=1.0, gpus_free=8),
        node("own-cheap-roomier-cpu", price_per_gpu_hour=1.0, gpus_free=8, vcpus_free=32, vcpus=128),
        node("foreign-dear", region_account_id=OTHER, region_public_jobs=True, price_per_gpu_hour=5.0),
    ]
    ranked = [c.name for c in place(job(), cands).ranked]
    assert ranked == [
        "own-cheap-roomy",  # 8 free GPUs, 64 vCPUs free
        "own-cheap-roomier-cpu",  # 8 free GPUs, 32 vCPUs free
        "own-cheap-a",
        "own-cheap-b",
        "own-dear",
        "foreign-cheap",
        "foreign-dear",
    ]
    # the other account sees the same fleet the other way round: its own region first
    assert [c.name for c in place(job(account_id=OTHER), cands).ranked][:2] == [
        "foreign-cheap",
        "foreign-dear",
    ]


def test_cpu_only_jobs_prefer_nodes_with_fewest_idle_gpus_then_most_free_cpus() -> None:
    cands = [
        node("gpu-idle", gpus_free=8),
        node("cpu-box-small", gpu_type=None, gpus_total=0, gpus_free=0, vcpus=32),
        node("cpu-box-big", gpu_type=None, gpus_total=0, gpus_free=0, vcpus=96),
        node("gpu-busy", gpus_free=0),
    ]
    ranked = [c.name for c in place(job(**CPU_JOB), cands).ranked]
    assert ranked == ["cpu-box-big", "gpu-busy", "cpu-box-small", "gpu-idle"]


def test_empty_fleet_and_fitting_summary() -> None:
    assert place(job(), []).summary().startswith("no capacity this account can use")
    assert not place(job(), []).waits
    assert place(job(), [node("a"), node("b", gpus_free=0)]).summary() == "fits 1 of 2 candidates; best a"


def test_closest_misses_come_first_and_only_those_asked_for_are_formatted() -> None:
    cands = [node(f"t4-{i}", gpu_type="T4") for i in range(5)] + [
        node("busy-b", gpus_free=0),
        node("busy-a", gpus_free=1),
        node("maint", state=NodeState.MAINTENANCE),
    ]
    placement = place(job(), cands)
    assert [(c.name, r) for c, r, _ in placement.closest(3)] == [
        ("busy-a", Rejection.TOO_FEW_GPUS),
        ("busy-b", Rejection.TOO_FEW_GPUS),
        ("maint", Rejection.MAINTENANCE),
    ]
    assert len(placement.rejected) == 8 and placement.rejected[:3] == placement.closest(3)
    assert "closest: busy-a has 1 of 8 GPUs free" in placement.summary()
    assert "(5 wrong GPU type, 1 in maintenance, 2 too few free GPUs)" in placement.summary()


# ------------------------------------------------------------------------------- properties

STATES = list(NodeState)
candidates_st = st.builds(
    lambda i, region, owner, public, gpu_type, total, free, price, state, online, ok, vfree: node(
        f"n{i}",
        id=f"id{i}",
        region=region,
        region_account_id=owner,
        region_public_jobs=public,
        gpu_type=gpu_type,
        gpus_total=total,
        gpus_free=min(free, total),
        price_per_gpu_hour=price,
        state=state,
        online=online,
        requirements_ok=ok,
        vcpus_free=vfree,
    ),
    st.integers(0, 30),  # names repeat on purpose: the id breaks the tie
    st.sampled_from(["lab", "east", "west"]),
    st.sampled_from([OWN, OTHER, None]),
    st.booleans(),
    st.sampled_from(["A100", "T4", "H100", None]),
    st.integers(0, 8),
    st.integers(0, 8),
    st.sampled_from([0.5, 1.0, 1.5, 3.0]),
    st.sampled_from(STATES),
    st.booleans(),
    st.booleans(),
    st.one_of(st.none(), st.integers(0, 64)),
)
fleets_st = st.lists(candidates_st, max_size=40).map(
    lambda cs: list({c.id: c for c in cs}.values())  # ids are unique in a snapshot
)
requests_st = st.builds(
    PlacementRequest,
    account_id=st.sampled_from([OWN, OTHER]),
    gpu_types=st.frozensets(st.sampled_from(["A100", "T4", "H100"]), max_size=2),
    gpu_count=st.integers(0, 8),
    cpu_count=st.sampled_from([0, 4, 16, 64]),
    max_price=st.sampled_from([None, 1.0, 2.0]),
    region=st.sampled_from([None, "lab", "east"]),
    region_reason=st.sampled_from([None, "datastore 'd'"]),
)


def _fits(request: PlacementRequest, c: Candidate) -> bool:
    """The rules restated plainly, to check `place` against."""
    gpu_job = request.gpu_count > 0
    return (
        (request.region is None or c.region == request.region)
        and (c.region_account_id == request.account_id or c.region_public_jobs)
        and (not gpu_job or not request.gpu_types or c.gpu_type in request.gpu_types)
        and (not gpu_job or request.max_price is None or c.price_per_gpu_hour <= request.max_price)
        and c.requirements_ok
        and c.state == NodeState.ACTIVE
        and c.online
        and c.gpus_free >= request.gpu_count
        and (gpu_job or c.free_vcpus >= request.cpu_count)
    )


@settings(max_examples=150, deadline=None)
@given(request=requests_st, cands=fleets_st, seed=st.integers(0, 2**16))
def test_every_candidate_is_ranked_or_rejected_once_deterministically(
    request: PlacementRequest, cands: list[Candidate], seed: int
) -> None:
    placement = place(request, cands)
    assert {c.id for c in placement.ranked} == {c.id for c in cands if _fits(request, c)}
    assert len(placement.ranked) + len(placement.missed) == len(cands)
    assert all(not _fits(request, c) for c in placement.missed)
    # no job ever lands on another account's private region
    assert all(c.region_account_id == request.account_id or c.region_public_jobs for c in placement.ranked)
    # own regions form a prefix of the ranking
    own = [c.region_account_id == request.account_id for c in placement.ranked]
    assert own == sorted(own, reverse=True)
    # the snapshot's order changes nothing
    shuffled = list(cands)
    random.Random(seed).shuffle(shuffled)
    again = place(request, shuffled)
    assert again.ranked == placement.ranked and again.rejected == placement.rejected
    # a prepared Fleet answers the same
    prepared = Fleet(shuffled).place(request)
    assert prepared.ranked == placement.ranked and prepared.rejected == placement.rejected


@settings(max_examples=60, deadline=None)
@given(reqs=st.lists(requests_st, max_size=6), cands=fleets_st)
def test_a_queue_never_books_more_than_is_free(reqs: list[PlacementRequest], cands: list[Candidate]) -> None:
    fleet = Fleet(cands)
    placements = place_queue(reqs, fleet)
    assert [p.request for p in placements] == reqs
    booked: dict[str, int] = {}
    for p in placements:
        if p.chosen is not None:
            assert _fits(p.request, p.chosen)
            booked[p.chosen.id] = booked.get(p.chosen.id, 0) + p.request.gpu_count
    after = {c.id: c for c in fleet.candidates}
    for c in cands:
        assert after[c.id].gpus_free == c.gpus_free - booked.get(c.id, 0) >= 0


# ------------------------------------------------------------------------------- fleet and queue


def test_fleet_take_books_capacity_and_reorders() -> None:
    a, b = node("a", gpus_free=8), node("b", gpus_free=6)
    fleet = Fleet([a, b])
    assert fleet.place(job()).chosen == a
    a_after = fleet.take(a, 4, 16)
    assert (a_after.gpus_free, a_after.free_vcpus) == (4, 48)
    assert fleet.place(job()).chosen == b  # b now has the most free GPUs
    assert len(fleet) == 2
    with pytest.raises(ValueError, match="has 4 GPUs and 48 vCPUs free"):
        fleet.take(a_after, 5)
    with pytest.raises(ValueError, match="not in this fleet"):
        fleet.take(a, 1)  # the stale copy: it was booked already


def test_region_owner_is_preferred_in_its_region_even_when_queued_later() -> None:
    """cloudbender, Regions: jobs of the region owner's projects are always preferred there."""
    shared = node("shared", region_account_id=OWN, region_public_jobs=True, gpus_total=2, gpus_free=2)
    foreign_first = job(account_id=OTHER)
    owner_later = job(account_id=OWN)
    first, second = place_queue([foreign_first, owner_later], Fleet([shared]))
    assert second.chosen is not None and second.chosen.name == "shared"
    assert first.chosen is None and first.waits
    assert "too few free GPUs" in first.summary() and "has 0 of 2 GPUs free" in first.summary()


def test_queue_fills_in_order_when_nobody_owns_the_region() -> None:
    shared = node("shared", region_account_id=None, region_public_jobs=True, gpus_free=3)
    first, second = place_queue([job(), job()], Fleet([shared]))
    assert first.chosen is not None and second.chosen is None


# ------------------------------------------------------------------------------- create-time refusal


def test_pinned_region_without_the_gpu_type_is_refused_at_create() -> None:
    fleet = [node("a", region="lab", gpu_type="T4", state=NodeState.MAINTENANCE), node("b", region="east")]
    pinned = job(region="lab", region_reason="reservation 'nb'")
    assert refusal_at_create(pinned, fleet) == (
        "region lab (reservation 'nb') has T4, not A100: "
        "ask for a GPU type of lab or use resources of another region"
    )
    # a type that exists there (in any state) waits instead; unpinned and CPU-only jobs are never refused
    assert refusal_at_create(job(region="lab", gpu_types=frozenset({"T4", "H100"})), fleet) is None
    assert refusal_at_create(job(), fleet) is None
    assert refusal_at_create(job(**CPU_JOB, region="lab"), fleet) is None
    assert "has no GPUs" in (refusal_at_create(job(region="west"), fleet) or "")


# ------------------------------------------------------------------------------- seam and table


class CloudCapacity:
    """A second capacity source, as the GCP jobs issue will add: one ephemeral node per GPU type."""

    def candidates(self, request: PlacementRequest) -> Iterable[Candidate]:
        for gpu_type in sorted(request.gpu_types):
            yield node(
                f"gcp-{gpu_type.lower()}",
                source=CandidateSource.GCP,
                provider="gcp",
                region="us-central1",
                gpu_type=gpu_type,
                price_per_gpu_hour=2.0,
            )


def test_other_capacity_sources_compete_on_the_same_rules() -> None:
    fleet = Snapshot([node("own", price_per_gpu_hour=3.0), node("t4", gpu_type="T4")])
    placement = place_from(job(gpu_types=frozenset({"A100", "H100"})), [fleet, CloudCapacity()])
    assert [c.name for c in placement.ranked] == ["gcp-a100", "gcp-h100", "own"]
    assert placement.chosen is not None and placement.chosen.source == CandidateSource.GCP
    limited = place_from(job(max_price=1.5), [fleet, CloudCapacity()])
    assert limited.chosen is None and Rejection.OVER_MAX_PRICE in limited.counts()


def test_a_candidate_holding_the_jobs_data_ranks_first_among_those_of_its_price() -> None:
    data = frozenset({"sha256:" + "1" * 64, "sha256:" + "2" * 64})
    fits = [
        node("a", gpus_free=8, price_per_gpu_hour=1.0),  # most GPUs free: first without data
        node("b", gpus_free=2, price_per_gpu_hour=1.0, holds=data),
        node("c", gpus_free=4, price_per_gpu_hour=1.0, holds=frozenset({"sha256:" + "1" * 64})),
        node("d", gpus_free=8, price_per_gpu_hour=0.5),  # cheaper: first whatever it holds
    ]
    without = place(job(gpu_count=1), fits)
    assert [c.name for c in without.ranked] == ["d", "a", "c", "b"]
    with_data = replace(job(gpu_count=1), data=data)
    placed = place(with_data, fits)
    assert [c.name for c in placed.ranked] == ["d", "b", "c", "a"]
    assert [c.name for c in Fleet(fits).place(with_data).ranked] == ["d", "b", "c", "a"]
    assert [r.data for r in match_rows(placed)] == ["fetch", "cached", "1/2 cached", "fetch"]
    cpu = replace(job(**CPU_JOB), data=data)
    cpus = [
        node(n, gpu_type=None, gpus_total=0, gpus_free=0, holds=h)
        for n, h in (("x", frozenset()), ("y", data))
    ]
    assert [c.name for c in place(cpu, cpus).ranked] == ["y", "x"]


def test_match_rows_print_like_launch() -> None:
    placement = place(
        job(), [node("b", gpus_free=4, price_per_gpu_hour=1.09), node("a", price_per_gpu_hour=2.0)]
    )
    rows = match_rows(placement)
    assert [r.cells() for r in rows] == [
        ("physical", "b", "64", "512.00", "A100:8 (4 free)", "lab", "2.18", "-", SELECTED_MARK),
        ("physical", "a", "64", "512.00", "A100:8 (8 free)", "lab", "4.00", "-", ""),
    ]
    assert len(MATCH_HEADERS) == len(rows[0].cells())
    assert match_rows(placement, limit=1) == rows[:1]
    cpu = match_rows(place(job(**CPU_JOB), [node("c", gpu_type=None, gpus_total=0, gpus_free=0)]))
    assert cpu[0].gpus == "-" and cpu[0].cost_per_hour == 0


def test_placement_is_plain_data() -> None:
    placement = place(job(), [node()])
    assert isinstance(placement, Placement)
    assert replace(placement.request, gpu_count=1).gpu_count == 1
