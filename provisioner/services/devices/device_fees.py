"""The daily device fee (docs/billing.md "Device fee"): each account pays, for each UTC day that is over,
15 × the distinct devices it had that day ÷ the days in that month (domain.billing_rules), one ledger entry
per (account, day) under the key `device_fee:ACCOUNT:YYYY-MM-DD`.

The devices an account had on a day come from services/devices/device_days.py (node rows and their removal
line
in the audit trail, never deleted), so a day can be charged late, after a crash, with the same answer.
Which days are due: from the day after the account's newest charged day (or its first device's day) to
the last complete day, and no later than the day its last device was removed. A day on which it had no
device is not charged and not looked at again once a later day is charged."""

from __future__ import annotations

from datetime import date, datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from provisioner.domain import billing_rules as rules
from provisioner.domain.billing_rules import Rule
from provisioner.services.billing import ledger
from provisioner.services.billing.ledger import NewEntry
from provisioner.services.devices import device_days
from provisioner.store.billing_models import LedgerEntry

Interval = tuple[datetime, datetime | None]


def _charged_through(session: Session) -> dict[str, date]:
    """Each account's newest charged device day."""
    rows = session.execute(
        select(LedgerEntry.payer, func.max(LedgerEntry.day))
        .where(LedgerEntry.rule == Rule.DEVICE_FEE.value, LedgerEntry.day.is_not(None))  # the partial index
        .group_by(LedgerEntry.payer)
    )
    return {payer: date.fromisoformat(day) for payer, day in rows if day}


def due_days(devices: list[Interval], charged_through: date | None, last: date) -> list[date]:
    """The days of one account to charge now (see the module's rule)."""
    first = min(added for added, _ in devices).date()
    if charged_through is not None:
        first = max(first, charged_through + timedelta(days=1))
    removals = [removed for _, removed in devices]
    if all(r is not None for r in removals):  # every device gone: nothing after the last removal's day
        last = min(last, max(r for r in removals if r is not None).date())
    return [first + timedelta(days=n) for n in range((last - first).days + 1)]


def entries_due(session: Session, now: datetime) -> list[NewEntry]:
    """The device-fee entries of every day that is over at `now` and not charged yet."""
    last = ledger.last_complete_day(now)
    charged = _charged_through(session)
    out: list[NewEntry] = []
    for account_id, devices in sorted(device_days.intervals_by_account(session).items()):
        for day in due_days(devices, charged.get(account_id), last):
            entry = ledger.device_day_entry(account_id, day, rules.devices_configured(day, devices))
            if entry is not None:
                out.append(entry)
    return out


def charge(session: Session, now: datetime) -> int:
    """Post every due device day (each once, by its key); how many entries were new."""
    return ledger.post(session, entries_due(session, now))
