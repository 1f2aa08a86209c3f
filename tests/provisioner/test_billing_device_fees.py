"""The daily device fee posted by the metering reconciler (docs/billing.md "Device fee"), on SQLite and
PostgreSQL, with the billing clock walked by hand: each (account, day) that is over is charged once, from
the devices services/devices/device_days.py counts, and a repeated pass adds nothing.

Devices are added and removed through the nodes service; the node rows and removal lines carry the wall
clock, so the test moves them back to a fixed week of November 2026 (a 30-day month, the product rules'), the
way
tests/provisioner/test_devices.py does."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from provisioner.domain import billing_rules as rules
from provisioner.domain import clock
from provisioner.domain.billing_rules import Rule
from provisioner.domain.states import NodeState
from provisioner.reconcilers import metering as reconciler
from provisioner.services.billing import ledger
from provisioner.services.common.account_lookup import root_account
from provisioner.services.devices import device_days, device_fees
from provisioner.services.fleet import nodes
from provisioner.services.regions import providers
from provisioner.services.regions import regions as region_service
from provisioner.store.billing_models import LedgerEntry
from provisioner.store.models import AuditEvent, Node
from tests.fixtures.postgres import Store

ACTOR = "operator:test"
NOV_16 = datetime(2026, 11, 16, 12, tzinfo=UTC)  # the ten devices were added at noon


def _edge_region(sessions: sessionmaker[Session]) -> str:
    """Region `edge` (central storage, its storage node active) of the root account; the account's id."""
    with sessions.begin() as s:
        providers.enable(s, "physical", {}, actor=ACTOR)
        region_service.create(s, "edge", provider="physical", storage_mode="central", actor=ACTOR)
        store = nodes.add(s, "store-e", region="edge", minion_id=f"{1:032x}", service="storage", actor=ACTOR)
        for state in (NodeState.ENROLLING, NodeState.PROVISIONING, NodeState.ACTIVE):
            nodes.transition(s, store, state, actor=ACTOR)
        return root_account(s).id


def _add_devices(sessions: sessionmaker[Session], first: int, count: int, added_at: datetime) -> list[str]:
    with sessions.begin() as s:
        ids = [
            nodes.add(
                s, f"cam-{n}", region="edge", minion_id=f"{n + 100:032x}", service="device", actor=ACTOR
            ).id
            for n in range(first, first + count)
        ]
        s.execute(update(Node).where(Node.id.in_(ids)).values(created_at=added_at))
    return ids


def _remove_devices(sessions: sessionmaker[Session], ids: list[str], removed_at: datetime) -> None:
    with sessions.begin() as s:
        for node_id in ids:
            nodes.remove(s, node_id, actor=ACTOR)
        s.execute(
            update(AuditEvent)
            .where(AuditEvent.resource_id.in_(ids), AuditEvent.to_state == NodeState.REMOVED.value)
            .values(at=removed_at)
        )


def _fees(sessions: sessionmaker[Session], account: str) -> dict[str, tuple[Decimal, Decimal]]:
    """day → (fee, devices) of the account's device-fee entries."""
    with sessions() as s:
        rows = s.execute(
            select(LedgerEntry.day, LedgerEntry.amount_micros, LedgerEntry.quantity_micros).where(
                LedgerEntry.rule == Rule.DEVICE_FEE.value, LedgerEntry.payer == account
            )
        )
        return {str(d): (rules.from_micros(a), rules.from_micros(q)) for d, a, q in rows}


def test_the_reconciler_charges_each_complete_day_once_from_the_devices_of_that_day(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    sessions: sessionmaker[Session] = store.sessions  # type: ignore[assignment]
    account = _edge_region(sessions)
    ten = _add_devices(sessions, 0, 10, NOV_16)
    manual = clock.ManualClock(datetime(2026, 11, 16, 23, 59, tzinfo=UTC))
    monkeypatch.setattr(clock, "CLOCK", manual)
    assert reconciler.run_once(sessions) == 0  # the 16th is not over yet
    manual.set(datetime(2026, 11, 17, 0, 30, tzinfo=UTC))
    assert reconciler.run_once(sessions) == 1
    assert reconciler.run_once(sessions) == 0  # a repeated pass adds nothing
    # product rules: 10 → 5 a day
    assert _fees(sessions, account) == {"2026-11-16": (Decimal("5"), Decimal("10"))}
    # product rules: start with 10, remove 5 → 5 that day and 2.5 on later days
    _remove_devices(sessions, ten[:5], datetime(2026, 11, 17, 10, tzinfo=UTC))
    manual.set(datetime(2026, 11, 19, 0, 5, tzinfo=UTC))
    assert reconciler.run_once(sessions) == 2  # the 17th and the 18th, in one pass
    fees = _fees(sessions, account)
    assert fees["2026-11-17"] == (Decimal("5"), Decimal("10"))
    assert fees["2026-11-18"] == (Decimal("2.5"), Decimal("5"))
    with sessions() as s:
        for day, (_, count) in fees.items():  # the fee's count is device_days's count of that day
            assert device_days.devices_on(s, account, date.fromisoformat(day)) == count
        assert ledger.balance(s, account) == Decimal("-12.5")
        assert sum(ledger.balances(s).values(), Decimal(0)) == 0


def test_seed_add_5_and_add_and_remove_5_times_through_the_store(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The product rules' two other examples through the nodes service and the reconciler: start with 10, add
    5 →
    7.5 that day; start with 10, add and remove a device 5 times → 7.5 that day and 5 on later days."""
    sessions: sessionmaker[Session] = store.sessions  # type: ignore[assignment]
    account = _edge_region(sessions)
    _add_devices(sessions, 0, 10, NOV_16 - timedelta(days=1))  # ten since the 15th
    day = datetime(2026, 11, 17, tzinfo=UTC)
    for n in range(5):  # churn on the 17th: five devices, each added and removed within it
        (one,) = _add_devices(sessions, 10 + n, 1, day + timedelta(hours=2 * n + 1))
        _remove_devices(sessions, [one], day + timedelta(hours=2 * n + 2))
    _add_devices(sessions, 20, 5, datetime(2026, 11, 19, 9, tzinfo=UTC))  # five more on the 19th
    monkeypatch.setattr(clock, "CLOCK", clock.ManualClock(datetime(2026, 11, 20, 1, tzinfo=UTC)))
    assert reconciler.run_once(sessions) == 5  # the 15th to the 19th
    assert reconciler.run_once(sessions) == 0
    fees = _fees(sessions, account)
    assert {d: f for d, (f, _) in fees.items()} == {
        "2026-11-15": Decimal("5"),
        "2026-11-16": Decimal("5"),
        "2026-11-17": Decimal("7.5"),  # 10 + 5 churned devices
        "2026-11-18": Decimal("5"),
        "2026-11-19": Decimal("7.5"),  # 10 + 5 added
    }


def test_days_after_the_last_device_left_are_not_charged_or_looked_at() -> None:
    added = datetime(2026, 11, 2, 8, tzinfo=UTC)
    gone = datetime(2026, 11, 4, 8, tzinfo=UTC)
    days = device_fees.due_days([(added, gone)], None, date(2026, 11, 30))
    assert days == [date(2026, 11, 2), date(2026, 11, 3), date(2026, 11, 4)]
    assert device_fees.due_days([(added, gone)], date(2026, 11, 4), date(2026, 11, 30)) == []
    assert device_fees.due_days([(added, None)], date(2026, 11, 28), date(2026, 11, 30)) == [
        date(2026, 11, 29),
        date(2026, 11, 30),
    ]
