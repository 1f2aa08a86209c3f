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

from sqlalchemy import Table, func, or_, select
from sqlalchemy.dialects import sqlite
from sqlalchemy.orm import Session

from contracts.errors import Conflict, InvalidInput
from provisioner.domain import billing_rules as rules
from provisioner.domain import clock
from provisioner.domain.billing_rules import Rule, Subject
from provisioner.store.account_models import Account
from provisioner.store.billing_models import LedgerEntry
from provisioner.store.models import new_id, utcnow


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs a setattr call per field, and
class NewEntry:  # metering makes tens of thousands of these a tick; nothing changes one after it is made
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

    def values(self, recorded_at: datetime) -> tuple[Any, ...]:
        """The row's values in the order of COLUMNS (what the PostgreSQL COPY writes)."""
        if self.amount < 0:
            raise ValueError(f"entry {self.key}: a negative amount is an entry the other way round")
        return (
            self.key,
            self.rule.value,
            self.subject.value,
            self.payer,
            self.payee,
            rules.to_micros(self.amount),
            rules.to_micros(self.quantity),
            self.job_id,
            self.worker,
            self.hour,
            self.day.isoformat() if self.day else None,
            self.region_id,
            self.gpu_type,
            self.period_start,
            self.period_end,
            self.at,
            recorded_at,
            self.memo,
        )

    def row(self, recorded_at: datetime) -> dict[str, Any]:
        return dict(zip(COLUMNS, self.values(recorded_at), strict=True))


# PostgreSQL: the batch is COPYed (binary, formatted by psycopg's C code) into a temporary staging table of
# this connection, then moved with one INSERT … SELECT … ON CONFLICT DO NOTHING. Parameter arrays
# (unnest) cost a Python call per element to send: for a metering tick of 10,000 jobs that was most of it.
_PG_TYPES: dict[str, str] = {
    "key": "text",
    "rule": "text",
    "subject": "text",
    "payer": "text",
    "payee": "text",
    "amount_micros": "int8",
    "quantity_micros": "int8",
    "job_id": "text",
    "worker": "int4",
    "hour": "int4",
    "day": "text",
    "region_id": "text",
    "gpu_type": "text",
    "period_start": "timestamptz",
    "period_end": "timestamptz",
    "at": "timestamptz",
    "recorded_at": "timestamptz",
    "memo": "text",
}
COLUMNS: tuple[str, ...] = tuple(_PG_TYPES)  # the order of NewEntry.values
_PG_COLUMNS = ", ".join(_PG_TYPES)
# ON COMMIT DELETE ROWS: a staged batch never outlives its transaction, whatever happens to it
_PG_STAGE = (
    "CREATE TEMPORARY TABLE IF NOT EXISTS ledger_stage "
    f"({', '.join(f'{c} {t}' for c, t in _PG_TYPES.items())}) ON COMMIT DELETE ROWS"
)
_PG_COPY = f"COPY ledger_stage ({_PG_COLUMNS}) FROM STDIN (FORMAT BINARY)"
_PG_MOVE = (
    f"INSERT INTO ledger_entries ({_PG_COLUMNS}) SELECT {_PG_COLUMNS} FROM ledger_stage "
    "ON CONFLICT (key) DO NOTHING RETURNING id"
)


def _post_postgresql(session: Session, rows: list[tuple[Any, ...]]) -> int:
    """`post` on PostgreSQL, on the session's own connection and transaction (psycopg's cursor)."""
    driver = session.connection().connection.driver_connection
    assert driver is not None
    with driver.cursor() as cursor:
        cursor.execute("SET LOCAL client_min_messages = warning")  # IF NOT EXISTS notices, every batch
        cursor.execute(_PG_STAGE)
        with cursor.copy(_PG_COPY) as copy:
            copy.set_types(list(_PG_TYPES.values()))
            for row in rows:
                copy.write_row(row)
        cursor.execute(_PG_MOVE)
        new = len(cursor.fetchall())
        cursor.execute("TRUNCATE ledger_stage")  # a second post in this transaction starts empty
        return new


def post(session: Session, entries: Sequence[NewEntry]) -> int:
    """Insert the entries whose key is not in the ledger yet; how many were new. Never updates a row."""
    if not entries:
        return 0
    now = utcnow()
    if session.get_bind().dialect.name == "postgresql":
        return _post_postgresql(session, [e.values(now) for e in entries])
    rows = [e.row(now) for e in entries]
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
    # every account (a few; accounts are never deleted), each balance an index lookup, rather than a scan
    # of the whole ledger for '%:earned' payees
    out: list[NewEntry] = []
    for earned in sorted(rules.earned_account(a) for a in session.scalars(select(Account.id))):
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
    entry = device_day_entry(account_id, day, rules.devices_configured(day, devices))
    return 0 if entry is None else post(session, [entry])


def device_day_entry(account_id: str, day: date, count: int) -> NewEntry | None:
    """The device fee of `account_id` for UTC `day` on `count` devices; None when it had none."""
    if count == 0:
        return None
    start, end = rules.day_bounds(day)
    return NewEntry(
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


def job_credits(session: Session, job_id: str) -> Decimal:
    """What a job's side paid so far (price, usage and federated fees), for `provision job show`."""
    stmt = select(func.coalesce(func.sum(LedgerEntry.amount_micros), 0)).where(
        LedgerEntry.job_id == job_id, LedgerEntry.payee == rules.PLATFORM
    )
    return rules.from_micros(int(session.scalar(stmt) or 0))


def paid_per_day(
    session: Session, account: str, days: int, now: datetime | None = None
) -> list[tuple[date, Decimal]]:
    """What `account` paid on each of the last `days` UTC days (today last), for the console's dashboard."""
    today = (now or datetime.now(UTC)).astimezone(UTC).date()
    first = today - timedelta(days=days - 1)
    since = datetime(first.year, first.month, first.day, tzinfo=UTC)
    paid = dict.fromkeys((first + timedelta(days=n) for n in range(days)), 0)
    for at, micros in session.execute(
        select(LedgerEntry.at, LedgerEntry.amount_micros).where(
            LedgerEntry.payer == account, LedgerEntry.at >= since
        )
    ):
        day = (at if at.tzinfo else at.replace(tzinfo=UTC)).astimezone(UTC).date()
        if day in paid:
            paid[day] += int(micros)
    return [(day, rules.from_micros(micros)) for day, micros in paid.items()]


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


def day_period_bounds(day: str) -> tuple[datetime, datetime]:
    """`YYYY-MM-DD` → [its first instant, the next day's) in UTC."""
    try:
        first = datetime.strptime(day, "%Y-%m-%d").replace(tzinfo=UTC)
    except ValueError:
        raise InvalidInput(f"day '{day}' is not YYYY-MM-DD, e.g. 2026-11-17", code="invalid_day") from None
    return first, first + timedelta(days=1)


def period_bounds(period: str) -> tuple[datetime, datetime]:
    """A month (`YYYY-MM`) or a UTC day (`YYYY-MM-DD`) as [start, end)."""
    return day_period_bounds(period) if len(period) > len("YYYY-MM") else month_bounds(period)


def usage(session: Session, account_id: str, period: str) -> list[UsageRow]:
    """What `account_id` paid and earned in `period` (a month, YYYY-MM, or a UTC day, YYYY-MM-DD), per
    job, GPU type and rule (transfers left out: they move credits inside the account; adjustments too:
    top-ups and refunds are not usage). Entries count in the month or day their period ends."""
    start, end = period_bounds(period)
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


def adjust(
    session: Session,
    account_id: str,
    amount: Decimal,
    memo: str,
    *,
    actor: str,
    idempotency_key: str | None = None,
) -> NewEntry:
    """Credit (`amount` > 0) or debit (< 0) an account by hand: a top-up, a refund, a correction. One
    entry between the platform and the account, rule `adjustment`, its memo naming who and why. The
    caller checks who may (admins of the root account). A retry with the same `idempotency_key` posts
    nothing (the answer carries the first entry's key); the key with another account or amount is
    refused."""
    if amount == 0 or abs(amount) > ADJUSTMENT_MAX:
        raise InvalidInput(
            f"an adjustment must be a non-zero amount of at most {ADJUSTMENT_MAX} credits, got {amount}",
            code="invalid_credits",
        )
    credit = amount > 0
    key = f"adjustment:{idempotency_key}" if idempotency_key else f"adjustment:{new_id('adj')}"
    entry = NewEntry(
        key=key,
        rule=Rule.ADJUSTMENT,
        subject=Subject.ADJUSTMENT,
        payer=rules.PLATFORM if credit else account_id,
        payee=account_id if credit else rules.PLATFORM,
        amount=rules.credits(abs(amount)),
        at=clock.now(),
        memo=f"{actor}: {memo}"[:500],
    )
    if post(session, [entry]) == 0:
        first = session.scalar(select(LedgerEntry).where(LedgerEntry.key == key))
        if first is None or (first.payer, first.payee, first.amount_micros) != (
            entry.payer,
            entry.payee,
            rules.to_micros(entry.amount),
        ):
            raise Conflict(
                f"idempotency key '{idempotency_key}' was used for another credit: use a new key",
                code="idempotency_key_reused",
            )
    return entry
