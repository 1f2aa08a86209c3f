"""The billing rules of docs/billing.md, each example of the product rules (docs/product-rules.md, "Billing
and Credits") as a named
test with its exact numbers, and properties: metering a run in any split of ticks gives the same
entries, and the ledger of any run balances to zero across accounts."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.catalogue import GpuClass
from contracts.gpu_types import GPU_TYPES
from provisioner.domain import billing_rules as rules
from provisioner.domain.billing_rules import JobFacts, Rule
from provisioner.domain.clock import ManualClock
from tests.fixtures.control_plane import ROOT

NOV_2026 = date(2026, 11, 17)  # November: 30 days
T0 = datetime(2026, 11, 17, 9, 30, tzinfo=UTC)


# ------------------------------------------------------------------------------- fees as data


def test_usage_fee_per_gpu_hour_by_class() -> None:
    assert rules.usage_fee_per_gpu_hour(GpuClass.DEVELOPMENT) == Decimal("0.05")
    assert rules.usage_fee_per_gpu_hour(GpuClass.PROFESSIONAL) == Decimal("0.10")
    assert rules.usage_fee_per_gpu_hour(GpuClass.DATACENTER) == Decimal("0.25")


def test_cpu_only_jobs_pay_no_usage_fee() -> None:
    assert rules.usage_fee_per_gpu_hour(None) == 0


def test_classes_come_from_the_catalogue_for_every_gpu_type() -> None:
    classes = rules.gpu_classes(yaml.safe_load((ROOT / "regions" / "gpus.yaml").read_text()))
    assert set(classes) == set(GPU_TYPES)
    assert classes["RTX 3090"] == GpuClass.DEVELOPMENT  # GeForce
    assert classes["RTX A6000"] == GpuClass.PROFESSIONAL  # the product rules' "Quadro/RTX A6000"
    assert classes["Radeon Pro W7900"] == GpuClass.PROFESSIONAL  # Radeon Pro
    assert classes["A100 40GB"] == GpuClass.DATACENTER  # Tesla line
    assert classes["MI300X"] == GpuClass.DATACENTER  # Radeon Instinct


def test_federated_fee_per_worker_hour() -> None:
    assert rules.federated_fee_per_worker_hour("inference") == Decimal("1.85")
    assert rules.federated_fee_per_worker_hour("endpoint") == Decimal("1.85")
    assert rules.federated_fee_per_worker_hour("training") == Decimal("2.65")


def test_a_job_is_federated_when_its_creator_is_not_its_project_owner() -> None:
    assert rules.is_federated("acc_creator", "acc_owner")
    assert not rules.is_federated("acc_owner", "acc_owner")


def test_money_is_decimal_at_six_places_never_float() -> None:
    assert rules.credits("1.2650004") == Decimal("1.265000")
    assert rules.credits("0.0000005") == Decimal("0.000001")  # half up
    assert rules.to_micros(Decimal("1.265")) == 1_265_000
    assert rules.from_micros(1_265_000) == Decimal("1.265")
    with pytest.raises(TypeError):
        rules.credits(1.265)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------- the product rules' examples


def test_seed_a100_at_2_78_earns_1_265_per_gpu_hour() -> None:
    assert rules.earnings_per_gpu_hour(Decimal("2.78"), GpuClass.DATACENTER) == Decimal("1.265")
    assert rules.DEFAULT_PUBLIC_PRICE_PER_GPU_HOUR["A100 40GB"] == Decimal("2.78")


def test_seed_a100_estimate_one_hour() -> None:
    e = rules.estimate(
        "A100 40GB", GpuClass.DATACENTER, 1, public=True, federated=None, public_price=Decimal("2.78")
    )
    assert (e.price, e.usage_fee_per_gpu_hour, e.owner_earnings) == (
        Decimal("2.78"),
        Decimal("0.25"),
        Decimal("1.265"),
    )
    eight = rules.estimate(
        "A100 40GB", GpuClass.DATACENTER, 8, public=True, federated="training", public_price=Decimal("2.78")
    )
    assert (eight.price, eight.owner_earnings, eight.federated_fee, eight.total_cost) == (
        Decimal("22.24"),
        Decimal("10.12"),
        Decimal("2.65"),
        Decimal("24.89"),
    )


def test_seed_device_fee_10_devices_is_5_a_day_in_a_30_day_month() -> None:
    devices = [(T0 - timedelta(days=40), None)] * 10
    assert rules.devices_configured(NOV_2026, devices) == 10
    assert rules.device_fee_for_day(10, NOV_2026) == Decimal("5")


def test_seed_device_fee_start_with_10_add_5_is_7_5_that_day() -> None:
    noon = datetime(2026, 11, 17, 12, tzinfo=UTC)
    devices = [(T0 - timedelta(days=40), None)] * 10 + [(noon, None)] * 5
    assert rules.device_fee_for_day(rules.devices_configured(NOV_2026, devices), NOV_2026) == Decimal("7.5")


def test_seed_device_fee_start_with_10_remove_5_is_5_that_day_and_2_5_later() -> None:
    noon = datetime(2026, 11, 17, 12, tzinfo=UTC)
    devices = [(T0 - timedelta(days=40), None)] * 5 + [(T0 - timedelta(days=40), noon)] * 5
    assert rules.device_fee_for_day(rules.devices_configured(NOV_2026, devices), NOV_2026) == Decimal("5")
    later = NOV_2026 + timedelta(days=1)
    assert rules.device_fee_for_day(rules.devices_configured(later, devices), later) == Decimal("2.5")


def test_seed_device_fee_add_and_remove_a_device_5_times_is_7_5_that_day_and_5_later() -> None:
    day = datetime(2026, 11, 17, tzinfo=UTC)
    churn = [(day + timedelta(hours=2 * i + 1), day + timedelta(hours=2 * i + 2)) for i in range(5)]
    devices = [(T0 - timedelta(days=40), None)] * 10 + churn
    assert rules.device_fee_for_day(rules.devices_configured(NOV_2026, devices), NOV_2026) == Decimal("7.5")
    later = NOV_2026 + timedelta(days=1)
    assert rules.device_fee_for_day(rules.devices_configured(later, devices), later) == Decimal("5")


def test_device_fee_month_length_comes_from_the_calendar() -> None:
    assert rules.device_fee_for_day(10, date(2026, 2, 3)) == Decimal("5.357143")  # 150 / 28
    assert rules.device_fee_for_day(10, date(2028, 2, 3)) == Decimal("5.172414")  # 150 / 29, leap year
    assert rules.device_fee_for_day(10, date(2026, 12, 3)) == Decimal("4.838710")  # 150 / 31


def test_usage_fee_rtx_3090_two_gpus_one_hour_and_a_partial_half_hour() -> None:
    facts = _facts(gpu_class=GpuClass.DEVELOPMENT, gpus=2, region_account="acc_customer")  # own region
    ended = T0 + timedelta(hours=1, minutes=30)
    pieces = rules.pieces(T0, ended, ended + timedelta(hours=5))
    assert [p.hours for p in pieces] == [Decimal(1), Decimal("0.5")]
    amounts = [c.amount for p in pieces for c in rules.charges_for(facts, 0, p)]
    assert amounts == [Decimal("0.10"), Decimal("0.05")]


def test_public_a100_hour_moves_2_78_from_customer_and_1_265_to_the_owners_earned_account() -> None:
    facts = _facts(price=Decimal("2.78"))
    [piece] = rules.pieces(T0, None, T0 + timedelta(hours=1, minutes=59))
    charges = {c.rule: c for c in rules.charges_for(facts, 0, piece)}
    assert charges[Rule.PUBLIC_PRICE].amount == Decimal("2.78")
    assert charges[Rule.PUBLIC_PRICE].payer == "acc_customer"
    assert charges[Rule.PUBLIC_EARNINGS].amount == Decimal("1.265")
    assert charges[Rule.PUBLIC_EARNINGS].payee == "acc_owner:earned"
    assert Rule.USAGE_FEE not in charges  # deducted from the price, not charged again


def test_federated_fee_goes_to_the_creator_per_worker_whatever_the_gpus() -> None:
    facts = _facts(creator="acc_creator", gpus=8, job_type="inference", region_account="acc_customer")
    [piece] = rules.pieces(T0, None, T0 + timedelta(hours=1))
    fed = [c for c in rules.charges_for(facts, 3, piece) if c.rule == Rule.FEDERATED_FEE]
    assert [(c.payer, c.amount, c.key) for c in fed] == [
        ("acc_creator", Decimal("1.85"), f"federated_fee:{facts.job_id}:3:0")
    ]


def test_hours_only_count_once_over_and_the_partial_hour_only_after_the_stop() -> None:
    assert rules.pieces(T0, None, T0 + timedelta(minutes=59)) == []
    assert len(rules.pieces(T0, None, T0 + timedelta(hours=3))) == 3
    ended = T0 + timedelta(hours=2, minutes=10)
    assert rules.pieces(T0, ended, ended)[-1].end == ended
    assert rules.pieces(T0, ended, ended, first=3) == []


def test_manual_clock_walks_through_hours() -> None:
    clock = ManualClock(T0)
    clock.advance(timedelta(hours=2))
    assert len(rules.pieces(T0, None, clock.now())) == 2
    with pytest.raises(ValueError):
        ManualClock(datetime(2026, 1, 1))


# ------------------------------------------------------------------------------- properties


def _facts(
    *,
    gpu_class: GpuClass = GpuClass.DATACENTER,
    gpus: int = 1,
    creator: str = "acc_customer",
    job_type: str = "training",
    region_account: str | None = "acc_owner",
    price: Decimal = Decimal("2.78"),
) -> JobFacts:
    return JobFacts(
        job_id="job_1",
        job_type=job_type,
        project_account="acc_customer",
        creator_account=creator,
        region_account=region_account,
        region_id="reg_1",
        gpu_type="A100 40GB",
        gpu_class=gpu_class,
        gpus_per_worker=gpus,
        price_per_gpu_hour=price,
    )


facts_strategy = st.builds(
    _facts,
    gpu_class=st.sampled_from(list(GpuClass)),
    gpus=st.integers(0, 8),
    creator=st.sampled_from(["acc_customer", "acc_creator"]),
    job_type=st.sampled_from(["training", "inference", "endpoint", "notebook"]),
    region_account=st.sampled_from(["acc_customer", "acc_owner"]),
    price=st.decimals(Decimal("0.25"), Decimal("40"), places=2),
)
run_seconds = st.integers(1, 30 * 3600)


@settings(max_examples=150, deadline=None)
@given(facts_strategy, run_seconds, st.lists(st.integers(0, 40 * 3600), max_size=12), st.integers(1, 3))
def test_any_split_of_ticks_posts_the_same_entries(
    facts: JobFacts, seconds: int, ticks: list[int], workers: int
) -> None:
    ended = T0 + timedelta(seconds=seconds)
    final = ended + timedelta(seconds=1)

    def meter(at: list[datetime]) -> dict[str, Decimal]:
        posted: dict[str, Decimal] = {}  # key → amount, as the ledger's unique key keeps them
        last = -1
        for now in sorted(at):
            for piece in rules.pieces(T0, ended if now >= ended else None, now, first=last + 1):
                for w in range(workers):
                    for c in rules.charges_for(facts, w, piece):
                        posted.setdefault(c.key, c.amount)
                last = piece.index
        return posted

    once = meter([final])
    split = meter([T0 + timedelta(seconds=t) for t in ticks] + [final])
    assert split == once
    total_hours = sum(p.hours for p in rules.pieces(T0, ended, final))
    assert total_hours == rules.hours(ended - T0)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(facts_strategy, run_seconds), min_size=1, max_size=6))
def test_the_ledger_balances_to_zero_across_accounts(runs: list[tuple[JobFacts, int]]) -> None:
    balances: Counter[str] = Counter()
    for facts, seconds in runs:
        ended = T0 + timedelta(seconds=seconds)
        for piece in rules.pieces(T0, ended, ended):
            for c in rules.charges_for(facts, 0, piece):
                assert c.amount >= 0 and c.payer != c.payee
                balances[c.payer] -= c.amount  # type: ignore[assignment]
                balances[c.payee] += c.amount  # type: ignore[assignment]
    assert sum(balances.values(), Decimal(0)) == 0


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.text(max_size=32),
        st.decimals(allow_nan=True, allow_infinity=True).map(str),
        st.from_regex(r"-?[0-9]{1,40}(\.[0-9]{1,10})?([eE][+-]?[0-9]{1,4})?", fullmatch=True),
    )
)
def test_a_typed_amount_is_credits_the_ledger_holds_or_a_one_line_refusal(text: str) -> None:
    """What an operator types as a price or a grant (services/prices.parse_credits): an amount at the
    ledger's scale that its 64-bit micro-credits hold, or InvalidInput. The API fuzzer found '1e22'-like
    prices answering 500: Decimal cannot put a number past its 28 digits at six places."""
    from contracts.errors import InvalidInput
    from provisioner.services.billing.prices import parse_credits

    try:
        value = parse_credits(text)
    except InvalidInput as refused:
        assert "\n" not in refused.message
        return
    assert value == rules.credits(value) and abs(value) <= rules.AMOUNT_MAX
    assert abs(rules.to_micros(value)) < 2**63
