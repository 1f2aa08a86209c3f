"""A job's URL through the node's tunnel (docs/job-urls.md), against a real `provision serve` on loopback and
the minion's own Tunnel, each figure side by side with a direct connection to the same server in one run:
the latency the tunnel adds to a small GET at p50 and p99 (keep-alive clients on both paths), the
throughput of a 64 MiB download, and 200 WebSocket connections held open through one node's tunnel to an
echo server, with the CPU this costs the control plane per connection (its process's CPU time while they
each send one message a second, read from /proc). The direct path is plain HTTP on loopback; the tunnel's
path is HTTPS to the control plane, a WebSocket stream over TLS to the minion, and TCP to the server.

Then the relay between the processes of `provision serve --workers 2` (api/tunnel_relay.py): the same GET
on a new connection each time, against one process and against two workers, where the request, the node's
tunnel and the node's stream each land on either process (about half the requests are relayed).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import websocket
from websockets.asyncio.server import ServerConnection, serve

from bench.results import figure
from tests.fixtures.control_plane import free_port
from tests.provisioner.test_job_urls import (
    Worker,
    endpoint,
    file_server,
    fleet_at,
    one_node,
    running,
    tunnel_of,
)

REQUESTS = 300
FRESH_REQUESTS = 200
DOWNLOAD_MB = 64
SOCKETS = 200
HOLD_S = 10.0


def _percentiles(timings: list[float]) -> tuple[float, float]:
    ordered = sorted(timings)
    return statistics.median(ordered) * 1000, ordered[int(len(ordered) * 0.99) - 1] * 1000


def _latency(client: httpx.Client, url: str) -> list[float]:
    client.get(url)  # the connection is open before timing starts
    out = []
    for _ in range(REQUESTS):
        started = time.perf_counter()
        assert client.get(url).status_code == 200
        out.append(time.perf_counter() - started)
    return out


def _fresh(cp_verify: object, url: str) -> list[float]:
    """GET on a new TLS connection each time, as the kernel then spreads them over the workers."""
    out = []
    for _ in range(FRESH_REQUESTS):
        started = time.perf_counter()
        with httpx.Client(verify=cp_verify, timeout=60) as client:  # type: ignore[arg-type]
            assert client.get(url).status_code == 200
        out.append(time.perf_counter() - started)
    return out


def _relayed(root: Path, site: Path, workers: int) -> tuple[float, float]:
    """p50 and p99 of a fresh-connection GET through a public endpoint's URL on a server of `workers`."""
    with (
        file_server(site) as http_port,
        fleet_at(root / f"home-{workers}", free_port(), workers=workers) as fleet,
    ):
        os.environ["SSL_CERT_FILE"] = str(fleet.cp.ca)
        deadline = time.monotonic() + 30
        pids: set[int] = set()
        while len(pids) < workers and time.monotonic() < deadline:  # every worker has started
            with httpx.Client(verify=fleet.cp.verify, timeout=5) as c:
                pids.add(c.get(f"{fleet.cp.url}/healthz").json()["pid"])
        one_node(fleet)
        files = running(fleet, "n-1", endpoint("files", public=True))
        tunnel = tunnel_of(fleet, "n-1", Worker({files["id"]: http_port}))
        try:
            url = f"{fleet.cp.url}/j/{files['id']}/small.txt"
            httpx.get(url, verify=fleet.cp.verify)  # the tunnel and the workers warm
            return _percentiles(_fresh(fleet.cp.verify, url))
        finally:
            tunnel.close()


def _download(client: httpx.Client, url: str, expect: str) -> float:
    started = time.perf_counter()
    digest = hashlib.sha256()
    with client.stream("GET", url) as answer:
        for chunk in answer.iter_bytes(1 << 20):
            digest.update(chunk)
    took = time.perf_counter() - started
    assert digest.hexdigest() == expect
    return DOWNLOAD_MB / took


def _echo_server(port: int, ready: threading.Event) -> Callable[[], None]:
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    async def echo(ws: ServerConnection) -> None:
        async for message in ws:
            await ws.send(message)

    async def run() -> None:
        async with serve(echo, "127.0.0.1", port, max_size=2**20):
            ready.set()
            await stop.wait()

    thread = threading.Thread(target=lambda: loop.run_until_complete(run()), daemon=True)
    thread.start()
    return lambda: loop.call_soon_threadsafe(stop.set)


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _hold(url: str, headers: list[str], sslopt: dict[str, str], pid: int | None) -> tuple[float, float]:
    """SOCKETS WebSockets opened, each sending one message a second for HOLD_S: (seconds to open them
    all, CPU seconds the process `pid` spent meanwhile per connection)."""
    started = time.perf_counter()
    sockets = [
        websocket.create_connection(url, header=headers, sslopt=sslopt, timeout=60) for _ in range(SOCKETS)
    ]
    opened = time.perf_counter() - started
    before = _cpu_s(pid) if pid else 0.0
    deadline = time.monotonic() + HOLD_S
    while time.monotonic() < deadline:
        tick = time.monotonic()
        for ws in sockets:
            ws.send("ping")
        for ws in sockets:
            assert ws.recv() == "ping"
        time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
    used = (_cpu_s(pid) - before) if pid else 0.0
    for ws in sockets:
        ws.close()
    return opened, used / SOCKETS


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="rigbase-bench-urls-") as tmp:
        root = Path(tmp)
        site = root / "site"
        site.mkdir()
        (site / "small.txt").write_text("ok\n")
        (site / "big.bin").write_bytes(secrets.token_bytes(DOWNLOAD_MB * 2**20))
        expect = hashlib.sha256((site / "big.bin").read_bytes()).hexdigest()
        ws_port = free_port()
        ready = threading.Event()
        stop_echo = _echo_server(ws_port, ready)
        assert ready.wait(10)
        with (
            file_server(site) as http_port,
            fleet_at(root / "home", free_port(), per_source=4 * SOCKETS) as fleet,
        ):
            os.environ["SSL_CERT_FILE"] = str(fleet.cp.ca)  # the fleet's plain httpx calls trust its CA
            one_node(fleet)
            files = running(fleet, "n-1", endpoint("files", public=True))
            echo = running(fleet, "n-1", endpoint("echo", public=True))
            tunnel = tunnel_of(fleet, "n-1", Worker({files["id"]: http_port, echo["id"]: ws_port}))
            try:
                through = f"{fleet.cp.url}/j/{files['id']}/"
                direct = f"http://127.0.0.1:{http_port}/"
                with httpx.Client(verify=fleet.cp.verify, timeout=60) as c, httpx.Client(timeout=60) as d:
                    t50, t99 = _percentiles(_latency(c, through + "small.txt"))
                    d50, d99 = _percentiles(_latency(d, direct + "small.txt"))
                    t_rate = _download(c, through + "big.bin", expect)
                    d_rate = _download(d, direct + "big.bin", expect)
                sslopt = {"ca_certs": str(fleet.cp.ca)}
                t_open, t_cpu = _hold(
                    f"{fleet.cp.url.replace('https://', 'wss://')}/j/{echo['id']}/",
                    [],
                    sslopt,
                    fleet.cp.process.pid,
                )
                d_open, _ = _hold(f"ws://127.0.0.1:{ws_port}/", [], {}, None)
            finally:
                tunnel.close()
                stop_echo()
        one50, one99 = _relayed(root, site, 1)
        two50, two99 = _relayed(root, site, 2)
    print(f"GET p50: {t50:.2f} ms through the URL, {d50:.2f} ms direct; p99: {t99:.2f} ms, {d99:.2f} ms")
    print(f"download: {t_rate:.0f} MB/s through the URL, {d_rate:.0f} MB/s direct")
    print(f"{SOCKETS} WebSockets: opened in {t_open:.2f} s ({d_open:.2f} s direct)", end="; ")
    print(f"{t_cpu * 1000:.1f} ms control-plane CPU each")
    figure("small GET p50 through the URL", t50, "ms", note=f"direct {d50:.2f} ms: {t50 / d50:.1f}x")
    figure("small GET p99 through the URL", t99, "ms", note=f"direct {d99:.2f} ms: {t99 / d99:.1f}x")
    figure("added latency p50", t50 - d50, "ms", target=10.0)
    figure(
        "download through the URL", t_rate, "MB/s", target=50.0, bound="≥", note=f"direct {d_rate:.0f} MB/s"
    )
    figure("download: URL ÷ direct", t_rate / d_rate, "×", note="1 would be as fast as loopback HTTP")
    figure(
        f"{SOCKETS} WebSockets held through one tunnel: open them all",
        t_open,
        "s",
        target=20.0,
        note=f"direct {d_open:.2f} s",
    )
    print(f"new-connection GET p50: {one50:.2f} ms on one process, {two50:.2f} ms on two workers")
    figure(
        "new-connection GET p50 through the URL, serve --workers 2",
        two50,
        "ms",
        note=f"one process {one50:.2f} ms: {two50 / one50:.2f}x",
    )
    figure(
        "new-connection GET p99 through the URL, serve --workers 2",
        two99,
        "ms",
        note=f"one process {one99:.2f} ms: {two99 / one99:.2f}x",
    )
    figure(
        f"control-plane CPU per WebSocket over {HOLD_S:.0f} s at 1 message/s",
        t_cpu * 1000,
        "ms",
        note=f"{t_cpu / HOLD_S * 100:.2f} % of a core per connection",
    )
