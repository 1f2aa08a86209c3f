"""Every fee of docs/billing.md as data, and the pure arithmetic that turns one period of a job or one day
of devices into ledger charges. Nothing here reads the store or the clock: services/billing/metering.py feeds
it
facts and posts what it returns, so every number of the docs is a test of this module.

Money is `Decimal`, never float, at a fixed scale of 6 decimal places (one millionth of a credit, "a
micro"); the store keeps integer micros (`to_micros`), so sums are exact on SQLite and PostgreSQL alike.
Each charge is rounded once, half up, to that scale (`credits`). The product rules' numbers are all exact at
it:
(2.78 − 0.25) ÷ 2 = 1.265 per GPU-hour; 15 × 15 ÷ 30 = 7.5 per day. A 31-day month rounds:
15 × 10 ÷ 31 = 4.838710.

Who pays whom (one ledger entry each; `payer` → `payee`):
- usage fee: the project's owner → PLATFORM, per GPU-hour by the GPU's class, on the owner's own regions.
  CPU-only jobs have no usage fee: the entry is posted with 0 so the hour still shows as metered.
- public price: the project's owner → PLATFORM, the locked price per GPU-hour, when the job runs in a region
  of another account (public capacity); no separate usage fee: it is deducted from the price.
- public earnings: PLATFORM → the region owner's earned account, (price − usage fee) ÷ 2 per GPU-hour.
- federated fee: the job's creator → PLATFORM, per worker-hour whatever the GPUs, when the creator's account
  is not the account that owns the job's project.
- earnings transfer: an account's earned account → the account, every 24 hours, no fee.
- device fee: the account → PLATFORM, daily: 15 × distinct devices configured that day ÷ days in the month."""

from __future__ import annotations

import calendar
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import ROUND_HALF_UP, Decimal
from enum import StrEnum
from functools import lru_cache
from typing import Any, Final

from contracts.catalogue import GpuClass

# ------------------------------------------------------------------------------- money

SCALE: Final = 6  # decimal places of every amount the ledger stores
QUANTUM: Final = Decimal(1).scaleb(-SCALE)  # 0.000001 credits
MICROS: Final = 10**SCALE
# The most credits one typed amount (a price, a grant, a debit) may be: the ledger keeps micro-credits in
# 64-bit integers (up to 9.2e12 credits), and a balance adds many amounts up.
AMOUNT_MAX: Final = Decimal(10**12)


def credits(value: Decimal | int | str) -> Decimal:
    """`value` at the ledger's fixed scale, rounded half up (floats are refused: they are not exact)."""
    if isinstance(value, float):
        raise TypeError("credits are Decimal, never float: pass Decimal(str(x))")
    return Decimal(value).quantize(QUANTUM, rounding=ROUND_HALF_UP)


@lru_cache(maxsize=4096)  # metering converts the same few amounts for thousands of jobs an hour
def to_micros(value: Decimal) -> int:
    return int(credits(value) * MICROS)


def from_micros(micros: int) -> Decimal:
    return (Decimal(micros) / MICROS).quantize(QUANTUM)


# ------------------------------------------------------------------------------- the fees


# credits per GPU per hour, charged to the owner of the job's project (product rules: "Usage Fee")
USAGE_FEE_PER_GPU_HOUR: Final[Mapping[GpuClass, Decimal]] = {
    GpuClass.DEVELOPMENT: Decimal("0.05"),
    GpuClass.PROFESSIONAL: Decimal("0.10"),
    GpuClass.DATACENTER: Decimal("0.25"),
}
CPU_ONLY_USAGE_FEE: Final = Decimal("0")  # the product rules list fees for GPUs only
# a GPU type the catalogue does not know pays the highest class's fee rather than none
UNKNOWN_GPU_CLASS: Final = GpuClass.DATACENTER

# credits per worker per hour, whatever its GPUs, charged to the job's creator when the job is federated
# (product rules: "Federated Training/Inference Fee"); notebooks are neither and pay none
FEDERATED_FEE_PER_WORKER_HOUR: Final[Mapping[str, Decimal]] = {
    "inference": Decimal("1.85"),
    "endpoint": Decimal("1.85"),
    "training": Decimal("2.65"),
}

# the region owner's share of (public price − usage fee) (product rules: "splits the remaining credits
# evenly")
EARNINGS_SHARE: Final = Decimal("0.5")

# public price per GPU-hour until the operator sets one (`provision price set`); the product rules price only
# the
# A100 ("other trainML customers will pay 2.78 credits per hour per GPU"), both catalogue models of it.
# A GPU type with no price here or in the store is sold at its usage fee: its owner earns nothing.
DEFAULT_PUBLIC_PRICE_PER_GPU_HOUR: Final[Mapping[str, Decimal]] = {
    "A100 40GB": Decimal("2.78"),
    "A100 80GB": Decimal("2.78"),
}
PRICE_MAX: Final = Decimal("10000")  # a price set above this is a typo, refused

DEVICE_FEE_PER_MONTH: Final = Decimal("15")  # per distinct device configured, charged daily

METERING_PERIOD: Final = timedelta(hours=1)  # hours are counted from the job's start
TRANSFER_PERIOD: Final = timedelta(hours=24)  # earned credits move to the balance once per UTC day


class Rule(StrEnum):
    """The rule that produced a ledger entry (its `rule` column)."""

    USAGE_FEE = "usage_fee"
    PUBLIC_PRICE = "public_price"
    PUBLIC_EARNINGS = "public_earnings"
    FEDERATED_FEE = "federated_fee"
    DEVICE_FEE = "device_fee"
    EARNINGS_TRANSFER = "earnings_transfer"
    ADJUSTMENT = "adjustment"


class Subject(StrEnum):
    """What an entry is for."""

    JOB_HOUR = "job_hour"  # (job, worker, hour index)
    DEVICE_DAY = "device_day"  # (account, UTC day)
    TRANSFER = "transfer"  # (account, UTC day)
    ADJUSTMENT = "adjustment"


# the ledger account that collects fees and pays earnings (the operator of this control plane)
PLATFORM: Final = "platform"
EARNED_SUFFIX: Final = ":earned"


def earned_account(account_id: str) -> str:
    """Where an account's public-job earnings accumulate until the daily transfer."""
    return f"{account_id}{EARNED_SUFFIX}"


def gpu_classes(catalogue: Mapping[str, Any]) -> dict[str, GpuClass]:
    """GPU type (`model`) → fee class, from the parsed catalogue regions/gpus.yaml."""
    out: dict[str, GpuClass] = {}
    for entry in (catalogue.get("gpus") or {}).values():
        out[str(entry["model"])] = GpuClass(entry["class"])
    return out


def usage_fee_per_gpu_hour(gpu_class: GpuClass | None) -> Decimal:
    """The usage fee of one GPU-hour; None (a CPU-only job) pays none."""
    return CPU_ONLY_USAGE_FEE if gpu_class is None else USAGE_FEE_PER_GPU_HOUR[gpu_class]


def federated_fee_per_worker_hour(job_type: str) -> Decimal:
    return FEDERATED_FEE_PER_WORKER_HOUR.get(job_type, Decimal(0))


def earnings_per_gpu_hour(price: Decimal, gpu_class: GpuClass | None) -> Decimal:
    """What the region owner earns per GPU-hour of a public job: (price − usage fee) ÷ 2, never negative."""
    return max(Decimal(0), (price - usage_fee_per_gpu_hour(gpu_class)) * EARNINGS_SHARE)


def is_federated(creator_account: str, project_account: str) -> bool:
    """A job is federated when the account that created it is not the account that owns its project."""
    return creator_account != project_account


def is_public(region_account: str | None, project_account: str) -> bool:
    """A job runs on public capacity when its region belongs to another account than its project."""
    return region_account is not None and region_account != project_account


# ------------------------------------------------------------------------------- hours of a job


def hours(delta: timedelta) -> Decimal:
    """A duration in hours, exactly (microseconds included)."""
    micros = (delta.days * 86400 + delta.seconds) * 10**6 + delta.microseconds
    return Decimal(micros) / Decimal(3600 * 10**6)


@dataclass(frozen=True, slots=True)
class Piece:
    """Hour `index` of a run (counted from its start): [start, end), shorter when the job stopped in it."""

    index: int
    start: datetime
    end: datetime

    @property
    def hours(self) -> Decimal:
        return hours(self.end - self.start)


def pieces(started_at: datetime, ended_at: datetime | None, now: datetime, first: int = 0) -> list[Piece]:
    """The hours of a run from index `first` that are over at `now`: every full hour that ended, and the
    partial last hour once the job stopped. Depends only on the run, not on when it is asked."""
    stop = now if ended_at is None else min(now, ended_at)
    out: list[Piece] = []
    index = first
    while True:
        start = started_at + index * METERING_PERIOD
        end = start + METERING_PERIOD
        if ended_at is not None and ended_at < end:
            end = ended_at
        if end > stop or end <= start:
            return out
        out.append(Piece(index, start, end))
        if ended_at is not None and end == ended_at:
            return out
        index += 1


@dataclass(frozen=True)
class JobFacts:
    """What metering needs to know of a job (services/billing/metering.py reads it from the store)."""

    job_id: str
    job_type: str
    project_account: str
    creator_account: str
    region_account: str | None
    region_id: str | None
    gpu_type: str | None
    gpu_class: GpuClass | None  # None: CPU-only
    gpus_per_worker: int
    price_per_gpu_hour: Decimal  # fixed at placement; used on public capacity only


@dataclass(frozen=True, slots=True)
class Charge:
    rule: Rule
    payer: str
    payee: str
    amount: Decimal
    quantity: Decimal  # GPU-hours (usage, price, earnings) or worker-hours (federated)
    key: str  # the idempotency key: one entry per (rule, job, worker, hour) ever


def job_hour_key(rule: Rule, job_id: str, worker: int, index: int) -> str:
    return f"{rule.value}:{job_id}:{worker}:{index}"


@dataclass(frozen=True, slots=True)
class Line:
    """A charge without its key: what a worker-hour of a job of some kind moves, from whom to whom."""

    rule: Rule
    payer: str
    payee: str
    amount: Decimal
    quantity: Decimal


def _line(rule: Rule, payer: str, payee: str, rate: Decimal, quantity: Decimal) -> Line:
    return Line(rule, payer, payee, credits(rate * quantity), credits(quantity))


# thousands of jobs an hour share a few kinds (accounts, GPU class and count, price, a full hour): their
# lines are computed once per kind; the keys, which name the job, are added per job by charges_for
@lru_cache(maxsize=8192)
def lines_for(
    job_type: str,
    project_account: str,
    creator_account: str,
    region_account: str | None,
    gpu_class: GpuClass | None,
    gpus_per_worker: int,
    price_per_gpu_hour: Decimal,
    piece_hours: Decimal,
) -> tuple[Line, ...]:
    """The lines one worker's `piece_hours` (an hour, or the partial last one) of such a job produces."""
    gpu_hours = piece_hours * gpus_per_worker
    out: list[Line] = []
    gpu_class = gpu_class if gpus_per_worker > 0 else None
    if is_public(region_account, project_account):
        assert region_account is not None
        price = price_per_gpu_hour if gpu_class is not None else Decimal(0)
        out.append(_line(Rule.PUBLIC_PRICE, project_account, PLATFORM, price, gpu_hours))
        earned = earnings_per_gpu_hour(price, gpu_class)
        if earned > 0:
            out.append(
                _line(Rule.PUBLIC_EARNINGS, PLATFORM, earned_account(region_account), earned, gpu_hours)
            )
    else:
        fee = usage_fee_per_gpu_hour(gpu_class)
        out.append(_line(Rule.USAGE_FEE, project_account, PLATFORM, fee, gpu_hours))
    federated = federated_fee_per_worker_hour(job_type)
    if is_federated(creator_account, project_account) and federated > 0:
        out.append(_line(Rule.FEDERATED_FEE, creator_account, PLATFORM, federated, piece_hours))
    return tuple(out)


def charges_for(facts: JobFacts, worker: int, piece: Piece) -> list[Charge]:
    """The entries one worker's hour (or partial hour) produces."""
    lines = lines_for(
        facts.job_type,
        facts.project_account,
        facts.creator_account,
        facts.region_account,
        facts.gpu_class,
        facts.gpus_per_worker,
        facts.price_per_gpu_hour,
        piece.hours,
    )
    return [
        Charge(
            x.rule,
            x.payer,
            x.payee,
            x.amount,
            x.quantity,
            job_hour_key(x.rule, facts.job_id, worker, piece.index),
        )
        for x in lines
    ]


# ------------------------------------------------------------------------------- devices


def days_in_month(day: date) -> int:
    return calendar.monthrange(day.year, day.month)[1]


def day_bounds(day: date) -> tuple[datetime, datetime]:
    start = datetime.combine(day, time(), tzinfo=UTC)
    return start, start + timedelta(days=1)


def devices_configured(day: date, devices: Iterable[tuple[datetime, datetime | None]]) -> int:
    """Distinct devices configured at any moment of the UTC `day`: each (added_at, removed_at) interval
    that overlaps it counts once (an addition is a new device; offline devices count). A device removed at
    the very instant the day began still counts that day, as services/devices/device_days.py counts it."""
    start, end = day_bounds(day)
    return sum(1 for added, removed in devices if added < end and (removed is None or removed >= start))


def device_fee_for_day(devices: int, day: date) -> Decimal:
    """15 × devices ÷ days in that month."""
    return credits(DEVICE_FEE_PER_MONTH * devices / days_in_month(day))


def device_day_key(account_id: str, day: date) -> str:
    return f"{Rule.DEVICE_FEE.value}:{account_id}:{day.isoformat()}"


def transfer_key(account_id: str, day: date) -> str:
    return f"{Rule.EARNINGS_TRANSFER.value}:{account_id}:{day.isoformat()}"


# ------------------------------------------------------------------------------- one hour, estimated


@dataclass(frozen=True)
class HourEstimate:
    """What one hour of a job costs and earns under these rules (`provision billing estimate`)."""

    gpu_type: str | None
    gpu_class: GpuClass | None
    gpu_count: int
    public: bool
    federated: str | None
    price_per_gpu_hour: Decimal  # the public price (0 on own capacity: the usage fee is what is paid)
    usage_fee_per_gpu_hour: Decimal
    usage_fee: Decimal  # charged to the project's owner on its own capacity; inside the price when public
    price: Decimal  # what the customer pays for the GPUs when public
    federated_fee: Decimal  # per worker, to the creator
    owner_earnings_per_gpu_hour: Decimal
    owner_earnings: Decimal
    total_cost: Decimal  # what the job's side pays for the hour, for one worker


def estimate(
    gpu_type: str | None,
    gpu_class: GpuClass | None,
    gpu_count: int,
    *,
    public: bool,
    federated: str | None,
    public_price: Decimal,
) -> HourEstimate:
    if gpu_count < 0:
        raise ValueError("gpu_count must be 0 or more")
    cls = gpu_class if gpu_count > 0 else None
    fee_rate = usage_fee_per_gpu_hour(cls)
    price_rate = public_price if public and cls is not None else Decimal(0)
    usage = credits(fee_rate * gpu_count) if not public else Decimal(0).quantize(QUANTUM)
    price = credits(price_rate * gpu_count)
    fed = credits(federated_fee_per_worker_hour(federated) if federated else Decimal(0))
    earn_rate = credits(earnings_per_gpu_hour(price_rate, cls)) if public else credits(0)
    return HourEstimate(
        gpu_type=gpu_type,
        gpu_class=cls,
        gpu_count=gpu_count,
        public=public,
        federated=federated,
        price_per_gpu_hour=credits(price_rate),
        usage_fee_per_gpu_hour=credits(fee_rate),
        usage_fee=usage,
        price=price,
        federated_fee=fed,
        owner_earnings_per_gpu_hour=earn_rate,
        owner_earnings=credits(earn_rate * gpu_count),
        total_cost=credits(usage + price + fed),
    )
