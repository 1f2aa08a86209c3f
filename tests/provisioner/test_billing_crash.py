"""The metering reconciler killed mid-pass: a real `provision serve` on PostgreSQL meters thousands of
running jobs (batches of services.metering.BATCH per transaction), is SIGKILLed once part of the ledger is
written, and is started again on the same database. The ledger ends exactly as the rules say: every
(rule, job, worker, hour) once, none lost, the totals those of domain.billing_rules. Then `provision job
show` has the job's credits so far and `provision region show` the region owner's earnings.

And two metering processes at once on one PostgreSQL database (two control planes whose leader leases
overlapped, or an operator's pass beside the server's): two OS processes each read every due entry, wait
until the other has read too, then post theirs in batches. Each entry is posted once, by one of them.

The jobs are written as rows (the bench's way: thousands of jobs through the lifecycle would take minutes
on this machine); what is under test is the metering process dying, not how jobs start. Their start is
set `HOURS` and a half back on the wall clock (the server's clock), so every job has HOURS hours over."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, insert, select
from sqlalchemy.orm import Session

from bench.bench_billing import job_sides, public_regions, running_job, running_worker
from provisioner.domain import billing_rules as rules
from provisioner.domain.billing_rules import JobFacts, Piece, Subject
from provisioner.services.billing import ledger, metering, prices
from provisioner.services.common.account_lookup import root_account
from provisioner.store.account_models import Account, Project
from provisioner.store.billing_models import LedgerEntry
from provisioner.store.engine import make_engine, make_sessionmaker, session_scope
from provisioner.store.job_models import Job, JobWorker
from provisioner.store.models import new_id, utcnow
from tests.fixtures.control_plane import ControlPlane, start_control_plane
from tests.fixtures.postgres import PostgresCluster, free_port

JOBS = 3000
HOURS = 24
TYPES = ["A100 40GB", "RTX 3090", "RTX A6000", "T4", "H100 80GB"]
METERED = LedgerEntry.subject == Subject.JOB_HOUR.value  # not the daily transfer of earnings


@dataclass
class Expected:
    """What the ledger must hold once metered, by domain.billing_rules."""

    paid: dict[str, Decimal] = field(default_factory=dict)  # job → what its side paid the platform
    earned: Decimal = Decimal(0)  # public earnings, all regions
    entries: int = 0
    root_job: str = ""  # a job of the root account (the CLI's admin token sees it)


def _seed(engine: Engine) -> Expected:
    """JOBS running jobs of 0-4 GPUs over four accounts and regions (a third public, a tenth federated)."""
    rng = random.Random(14)
    now = utcnow()
    start = now - timedelta(hours=HOURS, minutes=30)
    expected = Expected()
    with make_sessionmaker(engine).begin() as s:
        root = root_account(s)
        others = [Account(id=new_id("acc"), name=f"a{i}", root=False) for i in range(3)]
        s.add_all(others)
        s.flush()
        accounts = [root, *others]
        default = s.scalar(select(Project).where(Project.account_id == root.id, Project.default))
        assert default is not None
        projects = [default] + [
            Project(id=new_id("prj"), account_id=a.id, name="default", default=True) for a in others
        ]
        s.add_all(projects[1:])
        regions = public_regions(s, accounts)
        jobs, workers = [], []
        for i in range(JOBS):
            owner, region, creator = job_sides(rng)
            gpus, gpu_type, kind = rng.randint(0, 4), rng.choice(TYPES), rng.choice(["training", "inference"])
            started = start + timedelta(seconds=rng.randrange(600))
            job = running_job(
                f"j{i}",
                accounts[creator].id,
                projects[owner].id,
                regions[region].id,
                kind=kind,
                gpus=gpus,
                gpu_type=gpu_type,
                started=started,
                now=now,
                by="operator:test",
            )
            job_id = str(job["id"])
            jobs.append(job)
            workers.append(running_worker(job, now))
            facts = JobFacts(
                job_id=job_id,
                job_type=kind,
                project_account=accounts[owner].id,
                creator_account=accounts[creator].id,
                region_account=accounts[region].id,
                region_id=regions[region].id,
                gpu_type=gpu_type if gpus else None,
                gpu_class=prices.gpu_class_of(gpu_type) if gpus else None,
                gpus_per_worker=gpus,
                price_per_gpu_hour=Decimal("2.78"),
            )
            period = rules.METERING_PERIOD
            charges = [
                c
                for h in range(HOURS)
                for c in rules.charges_for(
                    facts, 0, Piece(h, started + h * period, started + (h + 1) * period)
                )
            ]
            expected.paid[job_id] = sum((c.amount for c in charges if c.payee == rules.PLATFORM), Decimal(0))
            expected.earned += sum((c.amount for c in charges if c.payer == rules.PLATFORM), Decimal(0))
            expected.entries += len(charges)
        s.execute(insert(Job), jobs)
        s.execute(insert(JobWorker), workers)
        expected.root_job = next(str(j["id"]) for j in jobs if j["project_id"] == default.id)
    return expected


def _paid_per_job(engine: Engine) -> dict[str, Decimal]:
    """What each job's side paid the platform, as metered."""
    with Session(engine) as s:
        per_job = s.execute(
            select(LedgerEntry.job_id, func.sum(LedgerEntry.amount_micros))
            .where(METERED, LedgerEntry.payee == rules.PLATFORM)
            .group_by(LedgerEntry.job_id)
        ).all()
    return {str(job): rules.from_micros(int(m)) for job, m in per_job}


def _ledger(engine: Engine) -> tuple[int, int]:
    """(entries metering posted, distinct keys among them)."""
    with Session(engine) as s:
        count = s.scalar(select(func.count()).select_from(LedgerEntry).where(METERED)) or 0
        keys = s.scalar(select(func.count(func.distinct(LedgerEntry.key))).where(METERED)) or 0
        return int(count), int(keys)


@pytest.fixture
def database(postgres_cluster: PostgresCluster) -> Iterator[str]:
    yield postgres_cluster.create_database(template=postgres_cluster.migrated_template())


@pytest.mark.slow
def test_a_metering_process_killed_mid_pass_posts_nothing_twice_and_loses_nothing(
    database: str, tmp_path: Path
) -> None:
    home, port = tmp_path / "home", free_port()
    with start_control_plane(home, database, port=port):
        pass  # the first start makes the root account and its default project; nothing runs yet
    engine = make_engine(database)
    expected = _seed(engine)
    with start_control_plane(home, database, port=port) as cp:
        deadline = time.monotonic() + 120
        while (posted := _ledger(engine)[0]) == 0:  # the first batch of the first pass committed
            assert time.monotonic() < deadline, (home / "server.log").read_text()
            time.sleep(0.02)
        os.kill(cp.process.pid, signal.SIGKILL)
        cp.process.wait()
    killed_at, _ = _ledger(engine)
    assert 0 < posted <= killed_at < expected.entries, "killed mid-pass"
    with start_control_plane(home, database, port=port) as cp:
        deadline = time.monotonic() + 180
        while True:  # the restarted server's first pass posts the rest
            time.sleep(0.5)
            with Session(engine) as s:
                due = s.scalar(
                    select(func.count(func.distinct(LedgerEntry.job_id))).where(LedgerEntry.hour == HOURS - 1)
                )
            if due == JOBS:
                break
            assert time.monotonic() < deadline, (due, (home / "server.log").read_text())
        count, keys = _ledger(engine)
        with Session(engine) as s:
            earned = s.scalar(
                select(func.sum(LedgerEntry.amount_micros)).where(
                    METERED, LedgerEntry.payer == rules.PLATFORM
                )
            )
            hours = s.scalar(select(func.max(LedgerEntry.hour)))
        assert count == keys == expected.entries  # none twice (one row per key), none lost
        assert hours == HOURS - 1
        assert _paid_per_job(engine) == expected.paid
        assert rules.from_micros(int(earned or 0)) == expected.earned
        _shows_credits(cp, expected.root_job, expected.paid[expected.root_job])
    engine.dispose()


def _shows_credits(cp: ControlPlane, job_id: str, paid: Decimal) -> None:
    """`provision job show` has the job's credits so far; `provision region show` the owner's earnings."""
    job = cp.provision("job", "show", job_id, "--json")
    assert job.returncode == 0, job.stderr
    assert Decimal(json.loads(job.stdout)["credits"]) == paid
    text = cp.provision("job", "show", job_id)
    assert text.returncode == 0 and "credits" in text.stdout, text.stderr
    region = cp.provision("region", "show", "r0", "--json")
    assert region.returncode == 0, region.stderr
    assert Decimal(json.loads(region.stdout)["credits_earned"]) > 0


# ------------------------------------------------------------------------------- two processes at once


def _meter_in_a_process(url: str, now: datetime, barrier: Any, posted: Any, index: int) -> None:
    """One metering pass in its own process and connection pool, the reconciler's steps
    (reconcilers/metering.py run_once), held at `barrier` between reading what is due and posting it:
    both processes have read every entry before either writes one."""
    engine = make_engine(url)
    sessions = make_sessionmaker(engine)
    with session_scope(sessions) as session:
        due = metering.due_entries(session, now)
    assert not due.more, "the seed fits in one read (metering.PASS_LIMIT)"
    barrier.wait(timeout=120)
    total = 0
    for batch in metering.batches(due.jobs):
        with session_scope(sessions) as session:
            total += ledger.post(session, batch)
    posted[index] = total
    engine.dispose()


@pytest.mark.slow
def test_two_metering_processes_at_once_post_every_entry_once(database: str, tmp_path: Path) -> None:
    with start_control_plane(tmp_path / "home", database, port=free_port()):
        pass  # the root account and its default project; the server is gone before the race
    engine = make_engine(database)
    expected = _seed(engine)
    spawn = multiprocessing.get_context("spawn")  # fresh interpreters: no connection inherited by fork
    barrier, posted = spawn.Barrier(2), spawn.Array("q", 2)
    now = utcnow()
    racers = [
        spawn.Process(target=_meter_in_a_process, args=(database, now, barrier, posted, i)) for i in range(2)
    ]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join(timeout=300)
    assert [r.exitcode for r in racers] == [0, 0]
    count, keys = _ledger(engine)
    assert count == keys == expected.entries  # every key once: none twice, none lost
    assert sum(posted[:]) == expected.entries  # what each process says it posted is what it inserted
    assert _paid_per_job(engine) == expected.paid
    with Session(engine) as s:
        balances = ledger.balances(s)
    assert sum(balances.values(), Decimal(0)) == 0  # double entry: the accounts balance to zero
    engine.dispose()
