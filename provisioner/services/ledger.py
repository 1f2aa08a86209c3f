"""The ledger: post entries (each once, by its idempotency key), balances as sums of entries, the ledger of
an account, and the daily transfer of earned credits (docs/billing.md).

`post` inserts with ON CONFLICT (key) DO NOTHING: a pass repeated after a crash, or the same pass run by two
API workers at once on PostgreSQL, leaves exactly one row per key. On PostgreSQL the second inserter waits
on the first's uncommitted row and then skips it; nothing is read first, so there is no window to race."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import Table, func, or_, select, text
from sqlalchemy.dialects import sqlite
from sqlalchemy.orm import Session

from contracts.errors import InvalidInput
from provisioner.domain import billing_rules as rules
from provisioner.domain import clock
from provisioner.domain.billing_rules import Rule, Subject
from provisioner.store.billing_models import LedgerEntry
from provisioner.store.models import new_id, utcnow


@dataclass(frozen=True, slots=True)
class NewEntry:
    """One entry to post: `amount` credits from `payer` to `payee`, for what `subject` and `key` say."""

    key: str
    rule: Rule
    subject: Subject
    payer: str
    payee: str
    amount: Decimal
    at: datetime
    quantity: Decimal = Decimal(0)
    job_id: str | None = None
    worker: int | None = None
    hour: int | None = None
    day: date | None = None
    region_id: str | None = None
    gpu_type: str | None = None
    period_start: datetime | None = None
    period_end: datetime | None = None
    memo: str | None = None

    def row(self, recorded_at: datetime) -> dict[str, Any]:
        if self.amount < 0:
            raise ValueError(f"entry {self.key}: a negative amount is an entry the other way round")
        return {
            "key": self.key,
            "rule": self.rule.value,
            "subject": self.subject.value,
            "payer": self.payer,
            "payee": self.payee,
            "amount_micros": rules.to_micros(self.amount),
            "quantity_micros": rules.to_micros(self.quantity),
            "job_id": self.job_id,
            "worker": self.worker,
            "hour": self.hour,
            "day": self.day.isoformat() if self.day else None,
            "region_id": self.region_id,
            "gpu_type": self.gpu_type,
            "period_start": self.period_start,
            "period_end": self.period_end,
            "at": self.at,
            "recorded_at": recorded_at,
            "memo": self.memo,
        }


# PostgreSQL: the whole batch as one INSERT … SELECT FROM unnest(arrays): one short statement whatever the
# number of rows (10,000 jobs' hour in well under a second; a VALUES list per row is parsed per batch)
_PG_TYPES: dict[str, str] = {
    "key": "text",
    "rule": "text",
    "subject": "text",
    "payer": "text",
    "payee": "text",
    "amount_micros": "bigint",
    "quantity_micros": "bigint",
    "job_id": "text",
    "worker": "int",
    "hour": "int",
    "day": "text",
    "region_id": "text",
    "gpu_type": "text",
    "period_start": "timestamptz",
    "period_end": "timestamptz",
    "at": "timestamptz",
    "recorded_at": "timestamptz",
    "memo": "text",
}
_PG_POST = text(
    f"INSERT INTO ledger_entries ({', '.join(_PG_TYPES)}) "
    f"SELECT * FROM unnest({', '.join(f'CAST(:{c} AS {t}[])' for c, t in _PG_TYPES.items())}) "
    "ON CONFLICT (key) DO NOTHING RETURNING id"
)


def post(session: Session, entries: Sequence[NewEntry]) -> int:
    """Insert the entries whose key is not in the ledger yet; how many were new. Never updates a row."""
    if not entries:
        return 0
    now = utcnow()
    rows = [e.row(now) for e in entries]
    if session.get_bind().dialect.name == "postgresql":
        columns = {c: [r[c] for r in rows] for c in _PG_TYPES}
        return len(session.execute(_PG_POST, columns).all())
    table = LedgerEntry.__table__
    assert isinstance(table, Table)
    # one compiled statement, executed many times; RETURNING counts only the rows that were new
    stmt = sqlite.insert(table).on_conflict_do_nothing(index_elements=["key"]).returning(table.c.id)
    return len(session.connection().execute(stmt, rows).all())


def _sum(session: Session, column: Any, account: str, as_of: datetime | None) -> int:
    stmt = select(func.coalesce(func.sum(LedgerEntry.amount_micros), 0)).where(column == account)
    if as_of is not None:
        stmt = stmt.where(LedgerEntry.at <= as_of)
    return int(session.scalar(stmt) or 0)


def balance(session: Session, account: str, as_of: datetime | None = None) -> Decimal:
    """What `account` received minus what it paid (entries effective at or before `as_of`)."""
    received = _sum(session, LedgerEntry.payee, account, as_of)
    paid = _sum(session, LedgerEntry.payer, account, as_of)
    return rules.from_micros(received - paid)


def balances(session: Session) -> dict[str, Decimal]:
    """Every ledger account's balance; they sum to zero (double entry)."""
    out: dict[str, int] = {}
    for column, sign in ((LedgerEntry.payee, 1), (LedgerEntry.payer, -1)):
        for account, total in session.execute(
            select(column, func.sum(LedgerEntry.amount_micros)).group_by(column)
        ):
            out[account] = out.get(account, 0) + sign * int(total)
    return {a: rules.from_micros(m) for a, m in sorted(out.items())}


def can_cover(session: Session, account: str) -> bool:
    """Whether `account` may start a job on public capacity: its balance is above zero."""
    return balance(session, account) > 0


def entries(
    session: Session,
    accounts: Sequence[str] | None = None,
    *,
    since: datetime | None = None,
    job_id: str | None = None,
    limit: int = 1000,
) -> list[LedgerEntry]:
    """Entries touching any of `accounts` (all when None), newest first."""
    stmt = select(LedgerEntry)
    if accounts is not None:
        stmt = stmt.where(or_(LedgerEntry.payer.in_(accounts), LedgerEntry.payee.in_(accounts)))
    if since is not None:
        stmt = stmt.where(LedgerEntry.at >= since)
    if job_id is not None:
        stmt = stmt.where(LedgerEntry.job_id == job_id)
    return list(session.scalars(stmt.order_by(LedgerEntry.at.desc(), LedgerEntry.id.desc()).limit(limit)))


def transfer_earnings(session: Session, day: date) -> int:
    """Move each account's earned credits as of the end of UTC `day` to its balance (one entry per account
    and day, no fee). Earnings posted late for that day are in the next day's transfer."""
    _, cutoff = rules.day_bounds(day)
    earned_accounts = session.scalars(
        select(LedgerEntry.payee).where(LedgerEntry.payee.like(f"%{rules.EARNED_SUFFIX}")).distinct()
    )
    out: list[NewEntry] = []
    for earned in earned_accounts:
        amount = balance(session, earned, as_of=cutoff)
        if amount <= 0:
            continue
        account = earned.removesuffix(rules.EARNED_SUFFIX)
        out.append(
            NewEntry(
                key=rules.transfer_key(account, day),
                rule=Rule.EARNINGS_TRANSFER,
                subject=Subject.TRANSFER,
                payer=earned,
                payee=account,
                amount=amount,
                at=cutoff,
                day=day,
                period_start=cutoff - rules.TRANSFER_PERIOD,
                period_end=cutoff,
            )
        )
    return post(session, out)


def last_complete_day(now: datetime) -> date:
    """The newest UTC day that is over at `now`."""
    return (now - timedelta(days=1)).date()


def charge_device_day(
    session: Session, account_id: str, day: date, devices: Sequence[tuple[datetime, datetime | None]]
) -> int:
    """Post the device fee of `account_id` for UTC `day` from its devices' (added_at, removed_at)
    intervals (the devices issue supplies them); nothing when no device was configured that day."""
    count = rules.devices_configured(day, devices)
    if count == 0:
        return 0
    start, end = rules.day_bounds(day)
    entry = NewEntry(
        key=rules.device_day_key(account_id, day),
        rule=Rule.DEVICE_FEE,
        subject=Subject.DEVICE_DAY,
        payer=account_id,
        payee=rules.PLATFORM,
        amount=rules.device_fee_for_day(count, day),
        quantity=Decimal(count),
        at=end,
        day=day,
        period_start=start,
        period_end=end,
    )
    return post(session, [entry])


def job_credits(session: Session, job_id: str) -> Decimal:
    """What a job's side paid so far (price, usage and federated fees), for `provision job show`."""
    stmt = select(func.coalesce(func.sum(LedgerEntry.amount_micros), 0)).where(
        LedgerEntry.job_id == job_id, LedgerEntry.payee == rules.PLATFORM
    )
    return rules.from_micros(int(session.scalar(stmt) or 0))


def region_earnings(session: Session, region_id: str) -> Decimal:
    """Credits the region's owner earned from public jobs there, for `provision region show`."""
    stmt = select(func.coalesce(func.sum(LedgerEntry.amount_micros), 0)).where(
        LedgerEntry.region_id == region_id, LedgerEntry.rule == Rule.PUBLIC_EARNINGS.value
    )
    return rules.from_micros(int(session.scalar(stmt) or 0))


@dataclass(frozen=True)
class UsageRow:
    """One line of `provision billing usage`: an account's entries of one job / GPU type / rule."""

    job_id: str | None
    gpu_type: str | None
    rule: str
    quantity: Decimal  # GPU-hours, worker-hours or device-days
    paid: Decimal
    earned: Decimal


def month_bounds(month: str) -> tuple[datetime, datetime]:
    """`YYYY-MM` → [first instant, first instant of the next month) in UTC."""
    try:
        first = datetime.strptime(month, "%Y-%m").replace(tzinfo=UTC)
    except ValueError:
        raise InvalidInput(f"month '{month}' is not YYYY-MM, e.g. 2026-11", code="invalid_month") from None
    nxt = (
        first.replace(year=first.year + 1, month=1)
        if first.month == 12
        else first.replace(month=first.month + 1)
    )
    return first, nxt


def usage(session: Session, account_id: str, month: str) -> list[UsageRow]:
    """What `account_id` paid and earned in `month`, per job, GPU type and rule (transfers left out: they
    move credits inside the account; adjustments too: top-ups and refunds are not usage). Entries count
    in the month their period ends."""
    start, end = month_bounds(month)
    earned = rules.earned_account(account_id)
    mine = or_(LedgerEntry.payer == account_id, LedgerEntry.payee.in_([account_id, earned]))
    rows = session.execute(
        select(
            LedgerEntry.job_id,
            LedgerEntry.gpu_type,
            LedgerEntry.rule,
            LedgerEntry.payer,
            func.sum(LedgerEntry.quantity_micros),
            func.sum(LedgerEntry.amount_micros),
        )
        .where(
            mine,
            LedgerEntry.at > start,
            LedgerEntry.at <= end,
            LedgerEntry.subject.not_in([Subject.TRANSFER.value, Subject.ADJUSTMENT.value]),
        )
        .group_by(LedgerEntry.job_id, LedgerEntry.gpu_type, LedgerEntry.rule, LedgerEntry.payer)
        .order_by(LedgerEntry.job_id, LedgerEntry.rule)
    )
    out: list[UsageRow] = []
    for job_id, gpu_type, rule, payer, quantity, amount in rows:
        paid = payer == account_id
        money = rules.from_micros(int(amount))
        zero = rules.credits(0)
        out.append(
            UsageRow(
                job_id=job_id,
                gpu_type=gpu_type,
                rule=rule,
                quantity=rules.from_micros(int(quantity)),
                paid=money if paid else zero,
                earned=zero if paid else money,
            )
        )
    return out


# An adjustment larger than this is a typo (a million credits), refused rather than posted.
ADJUSTMENT_MAX: Decimal = Decimal("1000000")


def adjust(session: Session, account_id: str, amount: Decimal, memo: str, *, actor: str) -> NewEntry:
    """Credit (`amount` > 0) or debit (< 0) an account by hand: a top-up, a refund, a correction. One
    entry between the platform and the account, rule `adjustment`, its memo naming who and why. The
    caller checks who may (admins of the root account)."""
    if amount == 0 or abs(amount) > ADJUSTMENT_MAX:
        raise InvalidInput(
            f"an adjustment must be a non-zero amount of at most {ADJUSTMENT_MAX} credits, got {amount}",
            code="invalid_credits",
        )
    credit = amount > 0
    entry = NewEntry(
        key=f"adjustment:{new_id('adj')}",
        rule=Rule.ADJUSTMENT,
        subject=Subject.ADJUSTMENT,
        payer=rules.PLATFORM if credit else account_id,
        payee=account_id if credit else rules.PLATFORM,
        amount=rules.credits(abs(amount)),
        at=clock.now(),
        memo=f"{actor}: {memo}"[:500],
    )
    post(session, [entry])
    return entry
