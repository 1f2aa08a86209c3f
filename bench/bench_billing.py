"""Metering: one hour tick over 10,000 running jobs on PostgreSQL, on one core.

The store holds 10,000 running jobs of 1-8 GPUs (a third public, a tenth federated), one worker each,
written as rows (the jobs service's own costs are not what is measured). A tick is the metering
reconciler's pass, `reconcilers.metering.run_once`, with the clock one hour after their start: it reads
the due jobs in one query and posts their entries in transactions of about 5,000 (about 14,000 ledger
rows: earnings only on public capacity, the federated fee only on the tenth that are and not notebooks).
The second tick at the same time posts nothing: the idempotent path, also timed. Pinned to one core with
os.sched_setaffinity; the database server runs on another. Besides the wall time it prints this process's
CPU time: on a shared machine the database's share of the wall time is what other load inflates."""

from __future__ import annotations

import os
import random
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from bench.results import figure
from provisioner.domain import clock
from provisioner.reconcilers import metering as reconciler
from provisioner.store.account_models import Account, Project
from provisioner.store.billing_models import LedgerEntry
from provisioner.store.engine import make_engine, make_sessionmaker
from provisioner.store.job_models import Job, JobWorker
from provisioner.store.migrate import upgrade
from provisioner.store.models import Provider, Region, new_id, utcnow

JOBS = 10_000
GOAL_S = 1.0
START = datetime(2026, 11, 17, 9, tzinfo=UTC)
TYPES = ["A100 40GB", "RTX 3090", "RTX A6000", "T4", "H100 80GB"]


def public_regions(s: Session, accounts: list[Account]) -> list[Region]:
    """A physical provider paid in credits and a healthy region r{i} of it, open to public jobs, owned by
    each account in turn."""
    provider = Provider(kind="physical", payment_mode="credits", state="enabled", version=1)
    s.add(provider)
    s.flush()
    regions = [
        Region(
            name=f"r{i}",
            provider_id=provider.id,
            account_id=account.id,
            state="healthy",
            storage_mode="local",
            public_jobs=True,
            settings={},
            version=1,
        )
        for i, account in enumerate(accounts)
    ]
    s.add_all(regions)
    s.flush()
    return regions


def job_sides(rng: random.Random) -> tuple[int, int, int]:
    """Which of the four accounts (and their regions) a job's project, region and creator are: a third run
    on another account's region (public capacity), a tenth were made by a third account (federated)."""
    owner = rng.randrange(4)
    region = owner if rng.random() > 1 / 3 else (owner + 1) % 4
    creator = owner if rng.random() > 0.1 else (owner + 2) % 4
    return owner, region, creator


def running_job(
    name: str,
    account_id: str,
    project_id: str,
    region_id: str,
    *,
    kind: str,
    gpus: int,
    gpu_type: str,
    started: datetime,
    now: datetime,
    by: str,
) -> dict[str, Any]:
    """The row of a job running since `started` on one placement at 2.78 credits per GPU hour (a bulk insert
    into Job, the jobs service's own costs aside)."""
    return {
        "id": new_id("job"),
        "name": name,
        "account_id": account_id,
        "project_id": project_id,
        "type": kind,
        "spec": {"resources": {"gpu_count": gpus}},
        "state": "running",
        "price_per_gpu_hour": 2.78,
        "region_id": region_id,
        "gpu_type": gpu_type,
        "placements": 1,
        "created_by": by,
        "created_at": now,
        "updated_at": now,
        "started_at": started,
        "version": 1,
    }


def running_worker(job: dict[str, Any], now: datetime) -> dict[str, Any]:
    """The row of a running job's only worker (a bulk insert into JobWorker): billed from its own start,
    at its job's GPUs, type and price."""
    return {
        "id": new_id("jwk"),
        "job_id": job["id"],
        "index": 0,
        "command": "train",
        "state": "running",
        "gpu_count": job["spec"]["resources"]["gpu_count"],
        "gpu_type": job["gpu_type"],
        "price_per_gpu_hour": job["price_per_gpu_hour"],
        "started_at": job["started_at"],
        "gpu_indices": [],
        "stop_requested": False,
        "log_bytes": 0,
        "log_complete": False,
        "created_at": now,
        "updated_at": now,
        "version": 1,
    }


def _seed(url: str) -> None:
    engine = make_engine(url)
    upgrade(url, engine)
    rng = random.Random(14)
    now = utcnow()
    with make_sessionmaker(engine).begin() as s:
        accounts = [Account(id=new_id("acc"), name=f"a{i}", root=False) for i in range(4)]
        s.add_all(accounts)
        s.flush()
        projects = [
            Project(id=new_id("prj"), account_id=a.id, name="default", default=True) for a in accounts
        ]
        s.add_all(projects)
        regions = public_regions(s, accounts)
        jobs, workers = [], []
        for i in range(JOBS):
            owner, region, creator = job_sides(rng)
            job = running_job(
                f"j{i}",
                accounts[creator].id,
                projects[owner].id,
                regions[region].id,
                kind=rng.choice(["training", "inference", "endpoint", "notebook"]),
                gpus=rng.randint(1, 8),
                gpu_type=rng.choice(TYPES),
                started=START + timedelta(seconds=rng.randrange(600)),
                now=now,
                by="operator:bench",
            )
            jobs.append(job)
            workers.append(running_worker(job, now))
        s.execute(insert(Job), jobs)
        s.execute(insert(JobWorker), workers)
    engine.dispose()


def main() -> None:
    from tests.fixtures.postgres import PostgresCluster

    with PostgresCluster() as cluster:
        url = cluster.create_database()
        _seed(url)
        engine = make_engine(url)
        sessions = make_sessionmaker(engine)
        before = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {min(before)})
        saved = clock.CLOCK
        clock.CLOCK = clock.ManualClock(START + timedelta(hours=1, minutes=11))
        try:
            started, cpu = time.perf_counter(), time.process_time()
            posted = reconciler.run_once(sessions)
            first, first_cpu = time.perf_counter() - started, time.process_time() - cpu
            started = time.perf_counter()
            again = reconciler.run_once(sessions)
            second = time.perf_counter() - started
        finally:
            clock.CLOCK = saved
            os.sched_setaffinity(0, before)
        with sessions() as s:
            rows = s.scalar(select(func.count()).select_from(LedgerEntry))
        engine.dispose()
    print(
        f"metering tick over {JOBS:,} running jobs (PostgreSQL, one core): {first:.3f} s, {posted:,} entries"
    )
    print(f"  goal < {GOAL_S:.1f} s: ratio {first / GOAL_S:.2f}; ledger rows {rows:,}")
    print(f"  of which this process on its core (CPU time): {first_cpu:.3f} s; the rest is the database")
    print(f"  the same tick again (idempotent, posts {again}): {second:.3f} s")
    figure(
        f"metering one hour tick of {JOBS:,} running jobs (PostgreSQL, one core)", first, "s", target=GOAL_S
    )
    figure("of which the metering process's CPU", first_cpu, "s")
    figure("the same tick repeated (posts nothing)", second, "s")


if __name__ == "__main__":
    main()
