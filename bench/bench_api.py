"""API benchmark: the control plane on SQLite and on PostgreSQL with 10,000 nodes stored.

Measures (one uvicorn process pinned to one core, client on the other):
- node list, pages of 500 (keyset pagination, walking all 20 pages) — target p99 < 50 ms;
- a state write (maintenance toggle: row lock, transition check, audit row, commit).
Prints requests/s, p50, p99 and the ratio p99 / 50 ms target (< 1.0 meets the target)."""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import httpx
from sqlalchemy import insert

from provisioner.services import providers, regions
from provisioner.store.engine import make_engine, make_sessionmaker
from provisioner.store.migrate import upgrade
from provisioner.store.models import AuditEvent, Node, new_id, utcnow

NODES = 10_000
PAGE = 500
TARGET_P99_MS = 50.0
LIST_ROUNDS = 10  # x 20 pages
WRITES = 400


def seed(url: str) -> None:
    engine = make_engine(url)
    upgrade(url, engine)
    with make_sessionmaker(engine).begin() as s:
        providers.enable(s, "physical", {}, actor="bench")
        region = regions.create(s, "bench-1", provider="physical", actor="bench")
        now = utcnow()
        rows = [
            dict(
                id=new_id("node"),
                name=f"n{i:05d}",
                region_id=region.id,
                minion_id=f"{i:032x}",
                service="compute",
                hostname=None,
                upnp=True,
                mining=False,
                state="active" if i % 2 else "maintenance",
                reason=None,
                inventory={"gpus": 4, "gpu_model": "RTX 4090"},
                requirements={"ok": True},
                last_heartbeat_at=now,
                created_at=now,
                updated_at=now,
                version=1,
            )
            for i in range(NODES)
        ]
        s.execute(insert(Node), rows)
        s.execute(
            insert(AuditEvent),
            [
                dict(
                    at=now,
                    actor="bench",
                    resource_kind="node",
                    resource_id=r["id"],
                    resource_name=r["name"],
                    from_state=None,
                    to_state=r["state"],
                )
                for r in rows
            ],
        )
    engine.dispose()


def measure(call: Callable[[], httpx.Response], n: int) -> tuple[float, float, float]:
    latencies = []
    started = time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        r = call()
        latencies.append((time.perf_counter() - t) * 1000)
        r.raise_for_status()
    elapsed = time.perf_counter() - started
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    return n / elapsed, statistics.median(latencies), p99


def run(backend: str, url: str, home: Path) -> None:
    from tests.fixtures.control_plane import start_control_plane

    seed(url)
    with start_control_plane(home, url, pin_cpu=0) as cp, cp.client() as c:
        cursor: list[str | None] = [None]

        def page() -> httpx.Response:
            r = c.get("/v1/nodes", params={"limit": PAGE, **({"after": cursor[0]} if cursor[0] else {})})
            body = r.json()
            assert len(body["items"]) == PAGE
            cursor[0] = body["next"]
            return r

        page()  # warm up
        cursor[0] = None
        rps, p50, p99 = measure(page, LIST_ROUNDS * NODES // PAGE)
        print(
            f"  {backend:10s} list page of {PAGE}: {rps:7.1f} req/s  p50 {p50:6.1f} ms  p99 {p99:6.1f} ms  "
            f"p99/target {p99 / TARGET_P99_MS:.2f}",
            flush=True,
        )
        i = [0]

        def write() -> httpx.Response:
            i[0] += 1
            return c.post(f"/v1/nodes/n{i[0] % NODES:05d}/maintenance", json={"mode": "toggle"})

        rps, p50, p99 = measure(write, WRITES)
        print(
            f"  {backend:10s} state write      : {rps:7.1f} req/s  p50 {p50:6.1f} ms  p99 {p99:6.1f} ms  "
            f"p99/target {p99 / TARGET_P99_MS:.2f}",
            flush=True,
        )


def main() -> None:
    from tests.fixtures.postgres import PostgresCluster

    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"API with {NODES} nodes; server: one uvicorn process on one core; "
        f"target p99 < {TARGET_P99_MS:.0f} ms; "
        f"load average {load} on {os.cpu_count()} cores (other work inflates p99)"
    )
    with ExitStack() as stack:
        tmp = Path(tempfile.mkdtemp(prefix="rigbase-bench-"))
        stack.callback(shutil.rmtree, tmp, True)
        (tmp / "sqlite").mkdir()
        run("sqlite", f"sqlite:///{tmp / 'sqlite' / 'rigbase.db'}", tmp / "sqlite")
        cluster = stack.enter_context(PostgresCluster())
        run("postgresql", cluster.create_database(), tmp / "pg")


if __name__ == "__main__":
    main()
