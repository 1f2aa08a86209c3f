"""A burst of simultaneous requests against a real `provision serve` never stalls on its own store.

The cause: a request's unit of work holds a pooled connection (on SQLite, the write lock) from its first
query until the `Db` dependency commits, and between the two it needs the shared worker-thread pool
again (the handler after a dependency that queried; FastAPI's response validation after a sync handler).
With more requests in flight than worker threads plus connections, every worker thread waited for a
connection held by a request waiting for a worker thread, until the pool's 30 s timeout (SQLite: its
30 s busy timeout) answered 500. provisioner/api/deps.py now admits at most as many units of work as
the pool and the threads can carry; these tests fail without that bound.

The burst is of operator reads (a dependency that queries, then a sync handler with a response model:
both hops), not of swtpm joins: a proof stalls on the same response hop (bench/bench_join_burst.py shows
it with 200 minions), but 200 swtpm processes cost the test machine more than the server under test."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from provisioner.api.admission import Admission, goes_first
from tests.fixtures.control_plane import ControlPlane, start_control_plane

# More than the worker threads (anyio: 40) plus the pool's connections (PostgreSQL 20, SQLite 15).
CLIENTS = 160
# The unfixed server answered the first requests after the pool's (or SQLite's busy) timeout of 30 s.
WITHIN_S = 25.0


def _burst(
    server: ControlPlane, request: Callable[[httpx.Client], httpx.Response]
) -> tuple[Counter[int], float]:
    """CLIENTS clients, each on its own open connection, send `request` at one instant: the statuses
    and the seconds until the last answer."""
    clients = [
        httpx.Client(
            base_url=server.url,
            headers={"Authorization": f"Bearer {server.token}"},
            timeout=120,
            verify=server.verify,
        )
        for _ in range(CLIENTS)
    ]
    gate = threading.Barrier(CLIENTS)

    def one(client: httpx.Client) -> int:
        assert client.get("/healthz").status_code == 200  # the TLS handshake, before the burst
        gate.wait()
        return request(client).status_code

    try:
        start = time.monotonic()
        with ThreadPoolExecutor(CLIENTS) as pool:
            statuses = Counter(pool.map(one, clients))
        return statuses, time.monotonic() - start
    finally:
        for client in clients:
            client.close()


def test_a_burst_of_operator_requests_is_answered_without_a_stall(tmp_path: Path, database_url: str) -> None:
    with start_control_plane(tmp_path / "home", database_url) as server:
        with server.client() as client:
            client.post("/v1/providers", json={"kind": "physical"}).raise_for_status()
            client.post("/v1/regions", json={"name": "burst", "provider": "physical"}).raise_for_status()
        statuses, elapsed = _burst(server, lambda c: c.get("/v1/regions"))
        log = (server.home / "server.log").read_text()
    assert statuses == {200: CLIENTS}, f"{statuses}; server log tail: {log[-600:]}"
    assert elapsed < WITHIN_S, f"{CLIENTS} reads took {elapsed:.1f} s"
    assert "QueuePool limit" not in log and "database is locked" not in log


# ---------------------------------------------------------------- the admission order, in one event loop


async def _admit_in_order(admission: Admission, requests: list[tuple[str, bool]]) -> list[str]:
    """Queue `requests` (name, first?) behind one held slot, release it: the order they were admitted."""
    order: list[str] = []
    await admission.acquire(first=False)  # the slot everyone waits for

    async def one(name: str, first: bool) -> None:
        await admission.acquire(first)
        order.append(name)
        admission.release()

    tasks = [asyncio.create_task(one(name, first)) for name, first in requests]
    await asyncio.sleep(0)  # every task is queued
    admission.release()
    await asyncio.gather(*tasks)
    return order


def test_a_proof_is_admitted_before_joins_that_queued_ahead_of_it() -> None:
    order = asyncio.run(
        _admit_in_order(Admission(1), [("join-1", False), ("join-2", False), ("proof-1", True)])
    )
    assert order == ["proof-1", "join-1", "join-2"]
    assert goes_first("/v1/join/j_abc/proof") and not goes_first("/v1/join")


def test_a_request_cancelled_while_waiting_leaves_no_slot_taken() -> None:
    async def scenario() -> int:
        admission = Admission(1)
        await admission.acquire(first=False)
        waiting = asyncio.create_task(admission.acquire(first=True))
        await asyncio.sleep(0)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        admission.release()
        await asyncio.wait_for(admission.acquire(first=False), 1)  # the slot came back
        return admission.busy

    assert asyncio.run(scenario()) == 1
