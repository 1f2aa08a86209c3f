"""The ledger in the store, on SQLite and PostgreSQL: a posted key stays one row; a job driven through the
real job lifecycle (services.jobs create → the node's report → stop) is metered hour by hour, public
earnings reach the region owner and move to its balance once a day; a pass that dies before committing
leaves nothing and the next one posts everything once; two sessions metering at once on PostgreSQL post
every entry exactly once.

The jobs service stamps started_at/ended_at with the wall clock, so to have hours behind a job the tests
move those two timestamps back (the only rows written directly; everything else goes through services)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from contracts.jobspec import JobSpec
from provisioner.domain import billing_rules as rules
from provisioner.domain.billing_rules import Rule, Subject
from provisioner.domain.roles import Principal, Role
from provisioner.domain.states import NodeState
from provisioner.services.accounts import accounts
from provisioner.services.billing import ledger, metering, prices
from provisioner.services.billing.ledger import NewEntry
from provisioner.services.fleet import node_address, nodes
from provisioner.services.jobs import job_assignments, jobs
from provisioner.services.regions import providers
from provisioner.services.regions import regions as region_service
from provisioner.store.account_models import Account
from provisioner.store.billing_models import LedgerEntry
from provisioner.store.engine import make_engine, make_sessionmaker
from provisioner.store.job_models import Job
from provisioner.store.migrate import upgrade
from tests.fixtures.postgres import PostgresCluster, Store

ACTOR = "operator:test"
A100 = {
    "pci_address": "0000:01:00.0",
    "vendor_id": "10de",
    "device_id": "20b0",
    "vendor": "NVIDIA",
    "name": "A100 40GB",
    "model": "A100 40GB",
    "gpu_class": "datacenter",
}


TOP_UP = Decimal("10")
TOPPED_UP_NOT = ~LedgerEntry.key.startswith("adjustment:")  # every entry but the world's top-up


@dataclass
class World:
    owner: Principal  # owns region `pub` (public jobs on, 2 x A100 40GB)
    customer: Principal


def principal_named(session: Session, name: str) -> Principal:
    account = session.scalar(select(Account).where(Account.name == name))
    assert account is not None
    return Principal(actor=f"operator:{name}", account_id=account.id, role=Role.ADMIN, root=account.root)


def active_a100_node(s: Session, region: str, n: int) -> None:
    """Node `a100-1` in `region`, active, reporting 2 x A100 40GB (minion_id from `n`)."""
    node = nodes.add(s, "a100-1", region=region, minion_id=f"{n:032x}", actor=ACTOR)
    for state in (NodeState.ENROLLING, NodeState.PROVISIONING, NodeState.ACTIVE):
        nodes.transition(s, node, state, actor=ACTOR)
    inventory = {
        "hostname": "a100-1",
        "cpu": {"physical_cores": 16, "threads": 32},
        "memory_total_bytes": 256 * 2**30,
        "tpm": {"present": True},
        "gpus": [A100, {**A100, "pci_address": "0000:02:00.0"}],
    }
    nodes.record_report(s, node, inventory=inventory, requirements={"ok": True, "rules": []})
    node_address.record(node, f"10.0.0.{n % 250 + 1}")  # where it beats from: its gang workers' peers find it


def _world(sessions: sessionmaker[Session]) -> World:
    with sessions.begin() as s:
        root = principal_named(s, "default")
        accounts.create(s, root, "owner")
        accounts.create(s, root, "customer")
        owner = principal_named(s, "owner")
        providers.enable(s, "physical", {}, actor=ACTOR)
        region_service.create(s, "pub", provider="physical", actor=ACTOR, account_id=owner.account_id)
        active_a100_node(s, "pub", 7)
        customer = principal_named(s, "customer")
        # a public job starts only for an account with credits: the operator tops the customer up
        ledger.adjust(s, customer.account_id, TOP_UP, "top-up", actor=ACTOR)
        return World(owner=owner, customer=customer)


def _a100_job(name: str) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": name,
            "type": "training",
            "resources": {"gpu_count": 1, "gpu_types": ["A100 40GB"]},
            "workers": ["python train.py"],
            "environment": {"image": "localhost/rigbase-job:test"},
        }
    )


def _run_job(sessions: sessionmaker[Session], world: World, name: str, hours_ago: float) -> str:
    """A public training job (1 x A100 40GB) of `customer` on the owner's node, running: created through
    the jobs service, reported running by the node; its start moved `hours_ago` back."""
    with sessions.begin() as s:
        submitted = jobs.create(s, world.customer, _a100_job(name))
        assert submitted.job is not None and submitted.job.state == "starting", submitted.job
        job_id = submitted.job.id
    _report(sessions, job_id, "running")
    with sessions.begin() as s:
        job = s.get(Job, job_id)
        assert job is not None and job.state == "running" and job.started_at is not None
        job.started_at -= timedelta(hours=hours_ago)
        for worker in job.workers:  # each worker is billed from its own start
            worker.started_at = job.started_at
        assert job.price_per_gpu_hour == 2.78
    return job_id


def _report(sessions: sessionmaker[Session], job_id: str, state: str, **more: Any) -> None:
    with sessions.begin() as s:
        node = nodes.get(s, "a100-1")
        desired = job_assignments.desired_for_node(s, node)
        mine = [w for w in desired["workers"] if w["job_id"] == job_id]
        assert mine, desired
        reports = [
            {"job_id": job_id, "worker": w["worker"], "generation": w["generation"], "state": state, **more}
            for w in mine
        ]
        job_assignments.record_actual(s, node, {"workers": reports})


def _stop(sessions: sessionmaker[Session], world: World, job_id: str, ran: timedelta) -> datetime:
    with sessions.begin() as s:
        jobs.stop(s, world.customer, job_id)
    _report(sessions, job_id, "stopped", exit_code=143)
    with sessions.begin() as s:
        job = s.get(Job, job_id)
        assert job is not None and job.state == "stopped" and job.started_at and job.ended_at
        job.ended_at = job.started_at + ran  # the stop came `ran` after the (moved) start
        for worker in job.workers:
            worker.ended_at = job.ended_at
        return job.ended_at


def _count(sessions: sessionmaker[Session]) -> int:
    """Ledger entries metering posted (the world's top-up left out)."""
    with sessions() as s:
        metered = select(func.count()).select_from(LedgerEntry).where(TOPPED_UP_NOT)
        return int(s.scalar(metered) or 0)


@pytest.fixture
def world(store: Store) -> World:
    return _world(store.sessions)  # type: ignore[arg-type]


def _entry(key: str, amount: str = "1.5") -> NewEntry:
    return NewEntry(
        key=key,
        rule=Rule.ADJUSTMENT,
        subject=Subject.ADJUSTMENT,
        payer=rules.PLATFORM,
        payee="acc_x",
        amount=Decimal(amount),
        at=datetime(2026, 11, 1, tzinfo=UTC),
    )


def test_a_key_is_posted_once_and_the_database_refuses_a_second_row(store: Store) -> None:
    sessions: sessionmaker[Session] = store.sessions  # type: ignore[assignment]
    with sessions.begin() as s:
        assert ledger.post(s, [_entry("k1"), _entry("k1", "9")]) == 1
    with sessions.begin() as s:
        assert ledger.post(s, [_entry("k1", "7")]) == 0
        assert ledger.balance(s, "acc_x") == Decimal("1.5")
    with pytest.raises(IntegrityError), sessions.begin() as s:  # not only post(): the store itself
        s.add(LedgerEntry(**_entry("k1").row(datetime.now(UTC))))
    with pytest.raises(ValueError), sessions.begin() as s:
        ledger.post(s, [_entry("k2", "-1")])
    assert _count(sessions) == 1


def test_a_public_a100_job_is_metered_hour_by_hour_and_earnings_move_daily(
    store: Store, world: World
) -> None:
    sessions: sessionmaker[Session] = store.sessions  # type: ignore[assignment]
    job_id = _run_job(sessions, world, "pub-train", hours_ago=2.25)
    with sessions.begin() as s:
        job = s.get(Job, job_id)
        assert job is not None and job.started_at is not None
        started = job.started_at
    for _ in range(2):  # a repeated pass adds nothing
        with sessions.begin() as s:
            metering.meter(s, started + timedelta(hours=2, minutes=10))
    owner, customer = world.owner.account_id, world.customer.account_id
    with sessions() as s:
        assert ledger.balance(s, customer) == TOP_UP - Decimal("5.56")  # 2 hours x 2.78
        assert ledger.balance(s, rules.earned_account(owner)) == Decimal("2.53")  # 2 x 1.265
    ended = _stop(sessions, world, job_id, ran=timedelta(hours=2, minutes=30))
    for _ in range(2):
        with sessions.begin() as s:
            metering.meter(s, ended + timedelta(minutes=1))
    with sessions() as s:
        assert ledger.balance(s, customer) == TOP_UP - Decimal("6.95")  # + half an hour: 1.39
        assert ledger.balance(s, rules.earned_account(owner)) == Decimal("3.1625")  # + 0.6325
        assert metering.due_job_ids(s) == []  # its last piece is in: never looked at again
        rows = ledger.entries(s, [customer], job_id=job_id)
        assert sorted((r.hour, r.rule) for r in rows) == [(h, "public_price") for h in range(3)]
        assert sum(ledger.balances(s).values(), Decimal(0)) == 0
        assert ledger.job_credits(s, job_id) == Decimal("6.95")
        assert job.region_id is not None and ledger.region_earnings(s, job.region_id) == Decimal("3.1625")
        paid = ledger.usage(s, customer, ended.strftime("%Y-%m"))
        assert [(u.rule, u.quantity, u.paid) for u in paid] == [
            ("public_price", Decimal("2.5"), Decimal("6.95"))
        ]
    day = ended.date()
    for _ in range(2):
        with sessions.begin() as s:
            ledger.transfer_earnings(s, day)
    with sessions() as s:
        assert ledger.balance(s, rules.earned_account(owner)) == 0
        assert ledger.balance(s, owner) == Decimal("3.1625")
        assert ledger.balance(s, rules.PLATFORM) == Decimal("6.95") - Decimal("3.1625") - TOP_UP


def test_a_pass_that_dies_before_commit_leaves_nothing_and_the_next_posts_once(
    store: Store, world: World
) -> None:
    sessions: sessionmaker[Session] = store.sessions  # type: ignore[assignment]
    job_id = _run_job(sessions, world, "crashy", hours_ago=5.5)
    with sessions() as s:
        job = s.get(Job, job_id)
        assert job is not None and job.started_at is not None
        now = job.started_at + timedelta(hours=5, minutes=30)
    with pytest.raises(RuntimeError), sessions.begin() as s:
        assert metering.meter(s, now).entries == 10  # 5 hours x (price, earnings)
        raise RuntimeError("the control plane dies here")
    assert _count(sessions) == 0
    with sessions.begin() as s:
        assert metering.meter(s, now).entries == 10
    with sessions.begin() as s:
        assert metering.meter(s, now).entries == 0


def test_device_days_post_once_per_account_and_day(store: Store, world: World) -> None:
    sessions: sessionmaker[Session] = store.sessions  # type: ignore[assignment]
    day = datetime(2026, 11, 17, tzinfo=UTC)
    devices = [(day - timedelta(days=3), None)] * 10 + [(day + timedelta(hours=9), None)] * 5
    for _ in range(2):
        with sessions.begin() as s:
            ledger.charge_device_day(s, world.owner.account_id, day.date(), devices)
    with sessions() as s:
        assert ledger.balance(s, world.owner.account_id) == Decimal("-7.5")


def test_price_set_is_the_public_price_and_refuses_below_the_usage_fee(store: Store, world: World) -> None:
    sessions: sessionmaker[Session] = store.sessions  # type: ignore[assignment]
    with sessions() as s:
        assert prices.price_for(s, "A100 40GB") == Decimal("2.78")  # the product rules' default
        assert prices.price_for(s, "RTX 3090") == Decimal("0.05")  # no price yet: its usage fee
        assert prices.price_for(s, None) == 0
    with sessions.begin() as s:
        root = principal_named(s, "default")
        row = prices.set_price(s, root, "RTX 3090", Decimal("0.45"))
        assert (row.price_per_gpu_hour, row.owner_earnings_per_gpu_hour, row.source) == (
            Decimal("0.45"),
            Decimal("0.2"),
            "set",
        )
    with sessions() as s:
        assert prices.price_for(s, "RTX 3090") == Decimal("0.45")
        with pytest.raises(Exception, match="between its usage fee 0.250000"):
            prices.set_price(s, principal_named(s, "default"), "A100 40GB", Decimal("0.1"))
        with pytest.raises(Exception, match="admin token of the root account"):
            prices.set_price(s, world.owner, "A100 40GB", Decimal("3"))


# ------------------------------------------------------------------------------- PostgreSQL race


@pytest.fixture
def race(postgres_cluster: PostgresCluster) -> Iterator[tuple[str, World]]:
    url = postgres_cluster.create_database()
    engine = make_engine(url)
    upgrade(url, engine)
    yield url, _world(make_sessionmaker(engine))
    engine.dispose()


ROUNDS = 6


@pytest.mark.slow
def test_two_sessions_metering_at_once_on_postgresql_post_every_entry_once(
    race: tuple[str, World],
) -> None:
    url, world = race
    engines = [make_engine(url), make_engine(url)]
    factories = [make_sessionmaker(e) for e in engines]
    job_id = _run_job(factories[0], world, "raced", hours_ago=ROUNDS + 0.5)
    with factories[0]() as s:
        job = s.get(Job, job_id)
        assert job is not None and job.started_at is not None
        started = job.started_at

    def attempt(worker: int, now: datetime, barrier: threading.Barrier) -> int:
        with factories[worker]() as s:
            ids = metering.due_job_ids(s)  # both see the job due before either writes
            barrier.wait()
            posted = metering.meter_jobs(s, ids, now)
            s.commit()
            return posted

    with ThreadPoolExecutor(2) as pool:
        for hour in range(1, ROUNDS + 1):
            barrier = threading.Barrier(2)
            now = started + timedelta(hours=hour, minutes=1)
            results = sorted(pool.map(lambda w, n=now, b=barrier: attempt(w, n, b), [0, 1]))
            assert results == [0, 2], (hour, results)  # one posts (price, earnings); the other nothing
    with factories[0]() as s:
        keyed = select(LedgerEntry.key, func.count()).where(TOPPED_UP_NOT).group_by(LedgerEntry.key)
        keys = s.execute(keyed).all()
        assert len(keys) == 2 * ROUNDS and all(n == 1 for _, n in keys)
        assert ledger.balance(s, world.customer.account_id) == TOP_UP - Decimal("2.78") * ROUNDS
    for engine in engines:
        engine.dispose()


def test_the_metering_reconciler_walks_a_manual_clock_through_hours_and_days(
    store: Store, world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    from provisioner.domain import clock
    from provisioner.reconcilers import metering as reconciler

    sessions: sessionmaker[Session] = store.sessions  # type: ignore[assignment]
    job_id = _run_job(sessions, world, "walked", hours_ago=0)
    with sessions() as s:
        job = s.get(Job, job_id)
        assert job is not None and job.started_at is not None
        started = job.started_at
    manual = clock.ManualClock(started)
    monkeypatch.setattr(clock, "CLOCK", manual)
    assert reconciler.run_once(sessions) == 0  # nothing is over yet
    manual.advance(timedelta(hours=1))
    assert reconciler.run_once(sessions) == 2  # the first hour: price and earnings
    assert reconciler.run_once(sessions) == 0
    manual.advance(timedelta(days=2))  # 48 more hours, and the first day's earnings move
    posted = reconciler.run_once(sessions)
    with sessions() as s:
        assert ledger.balance(s, world.customer.account_id) == TOP_UP - Decimal("2.78") * 49
        assert posted == 2 * 48 + 1 and ledger.balance(s, world.owner.account_id) > 0


def test_a_public_job_waits_for_credits_and_starts_once_topped_up(store: Store, world: World) -> None:
    sessions: sessionmaker[Session] = store.sessions  # type: ignore[assignment]
    with sessions.begin() as s:
        accounts.create(s, principal_named(s, "default"), "broke")
        broke = principal_named(s, "broke")
        job = jobs.create(s, broke, _a100_job("broke-job")).job
        assert job is not None and job.state == "waiting", job
        assert job.reason is not None and "no credits" in job.reason and "balance" in job.reason
        assert job.price_per_gpu_hour is None  # no price while it waits: the region it lands in decides
        ledger.adjust(s, broke.account_id, Decimal("5"), "top-up", actor=ACTOR)
        jobs.place_waiting(s, job, actor=ACTOR)
        assert job.state == "starting", job.reason
        assert job.price_per_gpu_hour == 2.78  # the public price, fixed as it is placed


def test_a_pass_over_its_memory_limit_reads_again_until_everything_is_posted(
    store: Store, world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After an outage the jobs owe more entries than one read holds (metering.PASS_LIMIT): the reconciler
    posts whole jobs, reads again and goes on until nothing is due; small limits stand in for big ones."""
    from provisioner.domain import clock
    from provisioner.reconcilers import metering as reconciler

    sessions: sessionmaker[Session] = store.sessions  # type: ignore[assignment]
    first = _run_job(sessions, world, "behind-1", hours_ago=0)
    second = _run_job(sessions, world, "behind-2", hours_ago=0)
    with sessions() as s:
        latest = s.scalar(select(func.max(Job.started_at)).where(Job.id.in_([first, second])))
        assert latest is not None
    monkeypatch.setattr(metering, "PASS_LIMIT", 1)  # one job per read
    monkeypatch.setattr(clock, "CLOCK", clock.ManualClock(latest + timedelta(hours=5, minutes=1)))
    posted = reconciler.run_once(sessions)
    with sessions() as s:
        rows = s.execute(select(LedgerEntry.rule, LedgerEntry.job_id)).all()
    # two jobs x five hours x (price, earnings); when the five hours cross midnight UTC the pass also moves
    # the finished day's earnings to the balance (one transfer entry): the count must not hang on the hour
    # the suite runs at
    assert sum(job in (first, second) for _, job in rows) == 2 * 5 * 2, rows
    assert posted == 2 * 5 * 2 + sum(rule == Rule.EARNINGS_TRANSFER for rule, _ in rows), rows
    assert reconciler.run_once(sessions) == 0
    with sessions() as s:
        for job_id in (first, second):
            assert ledger.job_credits(s, job_id) == Decimal("2.78") * 5


def test_own_capacity_needs_no_credits_and_its_usage_fee_takes_the_balance_below_zero(
    store: Store, world: World
) -> None:
    """docs/billing.md "Balances": the region's owner, with no credits, runs a job on its own A100; two
    hours of the 0.25 usage fee take its balance to -0.5, and its next own job still starts."""
    sessions: sessionmaker[Session] = store.sessions  # type: ignore[assignment]
    owner = world.owner.account_id
    with sessions.begin() as s:
        assert ledger.balance(s, owner) == 0
        job = jobs.create(s, world.owner, _a100_job("own-1")).job
        assert job is not None and job.state == "starting", job
        job_id = job.id
    _report(sessions, job_id, "running")
    with sessions.begin() as s:
        job = s.get(Job, job_id)
        assert job is not None and job.started_at is not None
        job.started_at -= timedelta(hours=2)
        for worker in job.workers:
            worker.started_at = job.started_at
        now = job.started_at + timedelta(hours=2, minutes=1)
    with sessions.begin() as s:
        assert metering.meter(s, now).entries == 2  # two hours of the usage fee, no price, no earnings
    with sessions.begin() as s:
        assert ledger.balance(s, owner) == Decimal("-0.5")
        assert not ledger.can_cover(s, owner)  # no public capacity for it now; its own still
        again = jobs.create(s, world.owner, _a100_job("own-2")).job
        assert again is not None
        assert again.state == "starting", again.reason
