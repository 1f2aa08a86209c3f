"""`provision serve --workers 2` on PostgreSQL: two API processes answer, exactly one of them runs the
reconcilers (/healthz says which), and when that one is killed (SIGKILL) another process takes the
reconcilers over within seconds while the API keeps answering. A job's URL answers through whichever
process the request, the node's tunnel and its streams reach (api/tunnel_relay.py)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import websocket

from tests.fixtures.control_plane import ControlPlane, free_port, start_control_plane
from tests.provisioner.test_job_urls import (
    Worker,
    endpoint,
    file_server,
    fleet_at,
    one_node,
    running,
    tunnel_of,
)


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
        assert cp.session_tickets() == 1  # the workers unpickled uvicorn's ssl_context_factory
        seen = _both_answer(cp, 30)
        assert len(seen) == 2 and sum(seen.values()) == 1, seen  # two workers, one leader
        os.kill(leader, signal.SIGKILL)
        successor = _leader(cp, 30, not_pid=leader)
        assert successor != leader
        with cp.client() as client:  # the API went on answering, writes included
            assert client.post("/v1/providers", json={"kind": "physical", "config": {}}).status_code == 201
        assert sum(_who(cp).values()) == 1


def test_with_two_workers_a_jobs_url_answers_whichever_process_holds_the_tunnel(
    tmp_path: Path, postgres_cluster: Any
) -> None:
    url = postgres_cluster.create_database()
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "index.html").write_text("served by the endpoint\n")
    with (
        fleet_at(tmp_path / "home", free_port(), database_url=url, workers=2) as fleet,
        file_server(tmp_path / "site") as site,
    ):
        assert len(_both_answer(fleet.cp, 30)) == 2
        one_node(fleet)
        job = running(fleet, "n-1", endpoint("two-workers", public=False))
        tunnel = tunnel_of(fleet, "n-1", Worker({job["id"]: site}))  # it reached one of the two
        try:
            address = f"{fleet.cp.url}/j/{job['id']}/"
            answers = []
            for _ in range(40):  # a new connection each time: the kernel spreads them over both processes
                with httpx.Client(verify=fleet.cp.verify, timeout=15) as client:
                    got = client.get(address, headers={"Authorization": f"Bearer {fleet.cp.token}"})
                    answers.append((got.status_code, got.text))
                    shown = client.get(
                        f"{fleet.cp.url}/v1/jobs/{job['id']}/url",
                        headers={"Authorization": f"Bearer {fleet.cp.token}"},
                    ).json()
                    assert shown["connected"] is True, shown
            assert answers == [(200, "served by the endpoint\n")] * 40, answers
            for _ in range(10):  # `job connect`'s WebSocket, a byte stream, on new connections too
                assert b"served by the endpoint" in _through_connect(fleet.cp, job["id"])
        finally:
            tunnel.close()


def _through_connect(cp: ControlPlane, job_id: str) -> bytes:
    """One HTTP/1.0 request over /v1/jobs/ID/connect (what `provision job connect` carries), to its close."""
    ws = websocket.create_connection(
        cp.url.replace("https://", "wss://") + f"/v1/jobs/{job_id}/connect?port=8000",
        header=[f"Authorization: Bearer {cp.token}"],
        sslopt={"ca_certs": str(cp.ca)},
        timeout=15,
    )
    try:
        ws.send_binary(b"GET / HTTP/1.0\r\n\r\n")
        received = b""
        while True:
            opcode, data = ws.recv_data()
            if opcode == websocket.ABNF.OPCODE_CLOSE:
                return received
            received += data
    finally:
        ws.close()
