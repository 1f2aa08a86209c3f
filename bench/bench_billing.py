"""Metering: one hour tick over 10,000 running jobs on PostgreSQL, on one core (issue 14 goal: < 1 s).

The store holds 10,000 running jobs of 1-8 GPUs (a third public, a tenth federated), one worker each,
written as rows (the jobs service's own costs are not what is measured). A tick is the metering
reconciler's pass, `reconcilers.metering.run_once`, with the clock one hour after their start: it finds
the due jobs, reads them in batches of 500 and posts their entries (20,000-30,000 ledger rows). The
second tick at the same time posts nothing: the idempotent path, also timed. Pinned to one core with
os.sched_setaffinity; the database server runs on another."""

from __future__ import annotations

import os
import random
import time
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, insert, select

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
        provider = Provider(kind="physical", payment_mode="credits", state="enabled", version=1)
        s.add_all([*projects, provider])
        s.flush()
        regions = [
            Region(
                name=f"r{i}",
                provider_id=provider.id,
                account_id=accounts[i].id,
                state="healthy",
                storage_mode="local",
                public_jobs=True,
                settings={},
                version=1,
            )
            for i in range(4)
        ]
        s.add_all(regions)
        s.flush()
        jobs, workers = [], []
        for i in range(JOBS):
            owner = rng.randrange(4)
            region = owner if rng.random() > 1 / 3 else (owner + 1) % 4
            creator = owner if rng.random() > 0.1 else (owner + 2) % 4
            job_id = new_id("job")
            jobs.append(
                {
                    "id": job_id,
                    "name": f"j{i}",
                    "account_id": accounts[creator].id,
                    "project_id": projects[owner].id,
                    "type": rng.choice(["training", "inference", "endpoint", "notebook"]),
                    "spec": {"resources": {"gpu_count": rng.randint(1, 8)}},
                    "state": "running",
                    "price_per_gpu_hour": 2.78,
                    "region_id": regions[region].id,
                    "gpu_type": rng.choice(TYPES),
                    "placements": 1,
                    "created_by": "operator:bench",
                    "created_at": now,
                    "updated_at": now,
                    "started_at": START + timedelta(seconds=rng.randrange(600)),
                    "version": 1,
                }
            )
            workers.append(
                {
                    "id": new_id("jwk"),
                    "job_id": job_id,
                    "index": 0,
                    "command": "train",
                    "state": "running",
                    "gpu_indices": [],
                    "stop_requested": False,
                    "log_bytes": 0,
                    "log_complete": False,
                    "created_at": now,
                    "updated_at": now,
                    "version": 1,
                }
            )
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
            started = time.perf_counter()
            posted = reconciler.run_once(sessions)
            first = time.perf_counter() - started
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
    print(f"  the same tick again (idempotent, posts {again}): {second:.3f} s")


if __name__ == "__main__":
    main()
