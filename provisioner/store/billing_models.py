"""Store models of billing: the append-only double-entry ledger and the public GPU price list.

Each `LedgerEntry` moves `amount_micros` (credits × 10^6, an integer: exact on both backends; see
domain/billing_rules.py for the scale) from `payer` (the account) to `payee` (the counter-account). A
balance is a sum of entries, never a stored column that could drift, and the sum over all accounts is
zero by construction. Ledger accounts are strings: an account id (`acc_…`), its earned credits
(`acc_…:earned`) and `platform`, so they carry no foreign key.

`key` is unique: each (rule, job, worker, hour), (account, day) is posted at most once, enforced by the
database, so a metering pass repeated after a crash or run by two API workers at once adds nothing twice
(services/billing/ledger.py inserts with ON CONFLICT DO NOTHING). Rows are never updated or deleted: a
correction
is an `adjustment` entry."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, CheckConstraint, Index, Integer, String, Text, text
from sqlalchemy.orm import Mapped, mapped_column

from provisioner.store.models import Base, UTCDateTime, utcnow

# SQLite autoincrements only an INTEGER PRIMARY KEY; PostgreSQL gets a bigint
BigId = BigInteger().with_variant(Integer(), "sqlite")


class LedgerEntry(Base):
    __tablename__ = "ledger_entries"
    __table_args__ = (
        CheckConstraint("amount_micros >= 0", name="ck_ledger_entries_amount_not_negative"),
        CheckConstraint("payer != payee", name="ck_ledger_entries_two_accounts"),
        Index("ix_ledger_entries_payer_at", "payer", "at"),
        Index("ix_ledger_entries_payee_at", "payee", "at"),
        Index("ix_ledger_entries_job", "job_id", "hour"),
        # the daily device fee's "newest charged day of each account" (services/devices/device_fees.py; 0020)
        Index(
            "ix_ledger_entries_rule_payer_day",
            "rule",
            "payer",
            "day",
            postgresql_where=text("day IS NOT NULL"),  # job-hour entries have no day: not indexed
            sqlite_where=text("day IS NOT NULL"),
        ),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    key: Mapped[str] = mapped_column(String(200), unique=True)  # the idempotency key
    rule: Mapped[str] = mapped_column(String(32))  # domain.billing_rules.Rule
    subject: Mapped[str] = mapped_column(String(16))  # domain.billing_rules.Subject
    payer: Mapped[str] = mapped_column(String(48))
    payee: Mapped[str] = mapped_column(String(48))
    amount_micros: Mapped[int] = mapped_column(BigInteger)
    # GPU-hours, worker-hours or devices, × 10^6: what the amount is a rate of
    quantity_micros: Mapped[int] = mapped_column(BigInteger, default=0)
    job_id: Mapped[str | None] = mapped_column(String(32))
    worker: Mapped[int | None] = mapped_column(Integer)
    hour: Mapped[int | None] = mapped_column(Integer)  # the hour's index, counted from the job's start
    day: Mapped[str | None] = mapped_column(String(10))  # YYYY-MM-DD (UTC) of device days and transfers
    region_id: Mapped[str | None] = mapped_column(String(32), index=True)
    gpu_type: Mapped[str | None] = mapped_column(String(64))
    period_start: Mapped[datetime | None] = mapped_column(UTCDateTime)
    period_end: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # when the entry takes effect (the end of the hour or day it is for): `--since` and the daily
    # transfer's cut-off compare this, not when the row happened to be written
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    memo: Mapped[str | None] = mapped_column(Text)


class GpuPrice(Base):
    """The operator's public price of a GPU type, credits per GPU-hour × 10^6 (`provision price set`)."""

    __tablename__ = "gpu_prices"

    gpu_type: Mapped[str] = mapped_column(String(64), primary_key=True)
    price_micros: Mapped[int] = mapped_column(BigInteger)
    updated_by: Mapped[str] = mapped_column(String(128))
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
