"""Exactly one process runs the reconcilers per store (provisioner/reconcilers/leader.py), on SQLite and on
PostgreSQL: three processes contend, one leads; SIGKILL the leader and another takes over within seconds;
the others never lead at the same time; a leader that steps down while it lives frees the lock at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CONTENDER = """
import sys, time
from provisioner.reconcilers.leader import Leadership
from provisioner.store.engine import make_engine
lead = Leadership(make_engine(sys.argv[1]), retry_s=0.2)
lead.start()
lead.wait()
print("leading", flush=True)
time.sleep(3600)
"""


def _contenders(url: str, n: int) -> list[subprocess.Popen[str]]:
    return [
        subprocess.Popen(
            [sys.executable, "-c", CONTENDER, url],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=os.environ,
        )
        for _ in range(n)
    ]


def _leaders(procs: list[subprocess.Popen[str]], timeout: float) -> list[subprocess.Popen[str]]:
    """The processes that said "leading" within `timeout` (each says it at most once)."""
    import selectors

    sel = selectors.DefaultSelector()
    for p in procs:
        if p.poll() is None and p.stdout is not None:
            sel.register(p.stdout, selectors.EVENT_READ, p)
    found: list[subprocess.Popen[str]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for key, _ in sel.select(max(0.0, deadline - time.monotonic())):
            line = key.fileobj.readline()  # type: ignore[union-attr]
            if line.strip() == "leading":
                found.append(key.data)
                sel.unregister(key.fileobj)
    return found


def _check_failover(url: str) -> None:
    procs = _contenders(url, 3)
    try:
        first = _leaders(procs, 4)
        assert len(first) == 1, f"{len(first)} leaders at once"
        os.kill(first[0].pid, signal.SIGKILL)
        first[0].wait()
        rest = [p for p in procs if p is not first[0]]
        second = _leaders(rest, 4)
        assert len(second) == 1, f"{len(second)} processes took over"
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_one_leader_and_failover_on_sqlite(tmp_path: Path) -> None:
    _check_failover(f"sqlite:///{tmp_path / 'rigbase.db'}")


def test_one_leader_and_failover_on_postgresql(postgres_cluster: Any) -> None:
    _check_failover(postgres_cluster.create_database())


def test_a_leader_that_steps_down_releases_the_lock_while_it_lives(postgres_cluster: Any) -> None:
    """The lock is held by a connection of the app's pool: closing it there would hand it back to the
    pool with the session, and the lock, still alive, so no other process could lead until this one died.
    Stepping down (stop, or a failed check) must end that session."""
    from sqlalchemy import text

    from provisioner.reconcilers.leader import LOCK_KEY, Leadership
    from provisioner.store.engine import make_engine

    url = postgres_cluster.create_database()
    engine, other = make_engine(url), make_engine(url)
    try:
        lead = Leadership(engine, retry_s=0.2)
        lead.start()
        assert lead.wait(10)
        with other.connect() as conn:
            assert not conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": LOCK_KEY}).scalar()
        lead.stop()  # the process lives on, its pool too
        with other.connect() as conn:
            assert conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": LOCK_KEY}).scalar()
    finally:
        engine.dispose()
        other.dispose()
