"""Admission of units of work: at most `slots` at once in a `provision serve` process, the rest waiting on
the event loop, where they hold neither a worker thread nor a pooled connection (provisioner/api/deps.py
says why the bound is needed at all).

Waiting units of work are admitted in arrival order, except that a request finishing what an earlier
request of the same client began (FIRST: a join's proof) goes before any that begins new work: a proof
must arrive within its nonce's lifetime (60 s), and in a burst of 1,000 joins the proofs queued behind
every later step 1 and 650 of them expired. Serving the proofs first, each step 1 that was
answered is followed by its proof within the time the proofs ahead of it take."""

from __future__ import annotations

import asyncio
import re
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Final
from weakref import WeakKeyDictionary

import anyio.to_thread
from anyio.lowlevel import RunVar
from sqlalchemy import Engine
from starlette.requests import Request

from provisioner.store.engine import pool_capacity

# Routes whose unit of work continues work already begun (matched against the request path).
FIRST: Final[tuple[re.Pattern[str], ...]] = (re.compile(r"/v1/join/[^/]+/proof", re.DOTALL),)


def goes_first(path: str) -> bool:
    return any(p.fullmatch(path) for p in FIRST)


@dataclass
class Admission:
    """A counting semaphore with two FIFO queues, the first served before the second. Single event loop
    (the one `provision serve` runs); not thread-safe, as asyncio's own primitives."""

    slots: int
    busy: int = 0
    _first: deque[asyncio.Future[None]] = field(default_factory=deque)
    _later: deque[asyncio.Future[None]] = field(default_factory=deque)

    async def acquire(self, first: bool) -> None:
        if self.busy < self.slots and not (self._first or self._later):
            self.busy += 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._first if first else self._later
        queue.append(waiter)
        try:
            await waiter  # release() hands its slot over: `busy` stays counted for it
        except asyncio.CancelledError:
            if waiter.cancelled():
                if waiter in queue:
                    queue.remove(waiter)
            else:  # the slot was handed over as the request was cancelled: pass it on
                self.release()
            raise

    def release(self) -> None:
        for queue in (self._first, self._later):
            while queue:
                waiter = queue.popleft()
                if not waiter.done():  # a cancelled waiter is done: skipped
                    waiter.set_result(None)
                    return
        self.busy -= 1


# Worker threads left to the sync work that holds no unit of work (reading a header, a console page).
THREAD_RESERVE = 8


def unit_of_work_slots(engine: Engine | None, threads: int) -> int:
    """How many units of work may run at once: no more than the pool has connections, and fewer than
    the worker threads, so an admitted one never waits for a thread held by one waiting for it."""
    capacity = pool_capacity(engine) if engine is not None else None
    spare = max(1, threads - THREAD_RESERVE)
    return max(1, min(capacity, spare) if capacity is not None else spare)


@dataclass
class Lanes:
    """An app's admissions: `units` for every unit of work, and `beats`, a narrower one a heartbeat passes
    first. A process runs Python on one core at a time (the GIL): a few beats in worker threads keep it
    busy while one waits on the database, and more only take turns at the GIL. At 333 beats/s on one core,
    up to eight beats at once answered with a p99 of 26 to 113 ms, three at once with 13 to 21 ms, at
    the same CPU per beat (bench/bench_fleet_heartbeats.py). Waiting beats hold nothing, and
    operator requests never queue behind the fleet's beats for a unit-of-work slot beyond these."""

    units: Admission
    beats: Admission


_PER_LOOP: RunVar[WeakKeyDictionary[Any, Lanes]] = RunVar("rigbase_admission")


def of_app(app: Any) -> Lanes:
    """The app's admissions in this event loop, made at its first request (the worker-thread limit
    belongs to the loop; a test client runs each app in a loop of its own)."""
    per_app = _PER_LOOP.get(None)
    if per_app is None:
        per_app = WeakKeyDictionary()
        _PER_LOOP.set(per_app)
    lanes = per_app.get(app)
    if lanes is None:
        threads = int(anyio.to_thread.current_default_thread_limiter().total_tokens)
        units = unit_of_work_slots(getattr(app.state, "engine", None), threads)
        settings = getattr(app.state, "settings", None)
        beats = min(units, settings.beats_at_once if settings is not None else units)
        lanes = per_app[app] = Lanes(Admission(units), Admission(beats))
    return lanes


@asynccontextmanager
async def _holding(admission: Admission, first: bool) -> AsyncIterator[None]:
    await admission.acquire(first=first)
    try:
        yield
    finally:
        admission.release()


@asynccontextmanager
async def admitted(request: Request) -> AsyncIterator[None]:
    """Hold one of the app's unit-of-work slots while the block runs (FIRST routes ahead of the rest)."""
    async with _holding(of_app(request.app).units, goes_first(request.url.path)):
        yield


@asynccontextmanager
async def beat_admitted(request: Request) -> AsyncIterator[None]:
    """A heartbeat's unit of work: a slot of the beats' lane, then one of every unit of work's."""
    lanes = of_app(request.app)
    async with _holding(lanes.beats, False), _holding(lanes.units, False):
        yield
