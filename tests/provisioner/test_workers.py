"""`provision serve --workers 2` on PostgreSQL: two API processes answer, exactly one of them runs the
reconcilers (/healthz says which), and when that one is killed (SIGKILL) another process takes the
reconcilers over within seconds while the API keeps answering."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx

from tests.fixtures.control_plane import ControlPlane, start_control_plane


def _who(cp: ControlPlane, tries: int = 60) -> dict[int, bool]:
    """pid → reconciler_leader, from fresh connections (each may land on another worker)."""
    seen: dict[int, bool] = {}
    for _ in range(tries):
        with httpx.Client(verify=cp.verify, timeout=5) as c:  # a new connection each time
            body = c.get(f"{cp.url}/healthz").json()
        seen[body["pid"]] = body["reconciler_leader"]
    return seen


def _leader(cp: ControlPlane, timeout: float, not_pid: int | None = None) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        leaders = [pid for pid, leading in _who(cp, 20).items() if leading and pid != not_pid]
        if leaders:
            return leaders[0]
        time.sleep(0.5)
    raise AssertionError(f"no process took the reconcilers over within {timeout:.0f} s: {_who(cp)}")


def _both_answer(cp: ControlPlane, timeout: float) -> dict[int, bool]:
    """The second worker may still be importing when the first answers: ask until both have."""
    deadline = time.monotonic() + timeout
    seen: dict[int, bool] = {}
    while time.monotonic() < deadline:
        seen = _who(cp)
        if len(seen) == 2:
            return seen
        time.sleep(0.5)
    return seen


def test_two_workers_one_reconciler_leader_and_failover(tmp_path: Path, postgres_cluster: Any) -> None:
    url = postgres_cluster.create_database()
    with start_control_plane(tmp_path / "home", url, extra_args=("--workers", "2")) as cp:
        leader = _leader(cp, 20)
        assert not cp.session_tickets()  # the workers unpickled uvicorn's ssl_context_factory
        seen = _both_answer(cp, 30)
        assert len(seen) == 2 and sum(seen.values()) == 1, seen  # two workers, one leader
        os.kill(leader, signal.SIGKILL)
        successor = _leader(cp, 30, not_pid=leader)
        assert successor != leader
        with cp.client() as client:  # the API went on answering, writes included
            assert client.post("/v1/providers", json={"kind": "physical", "config": {}}).status_code == 201
        assert sum(_who(cp).values()) == 1
