"""Observability benchmark: what job metrics, GET /metrics and the console's dashboard cost the control
plane (a real `provision serve`, one process on one core, client on the other).

- Metric ingest from the log path: a worker's log chunks (256 KiB each, as a minion sends them) of
  `rigbase:metric` lines with 8 metrics each, posted over the node credential route. Side by side with
  the same bytes of plain log lines, in one run: points per second, and the server's CPU per point (its
  process tree's CPU, /proc) and per chunk against plain lines.
- GET /metrics with 10,000 nodes stored (8-GPU inventories, as bench_api seeds them): p50 and p99, and
  its ratio to a page of 500 nodes of GET /v1/nodes on the same server.
- The console's region page for 1,000 and 10,000 nodes against the same page for 10: bytes and server time
  (request to last byte; the browser's own rendering is not in it)."""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.bench_api import seed
from bench.harness import tree_cpu_s
from bench.results import figure
from contracts.jobs import LOG_CHUNK_MAX
from contracts.metrics import METRIC_POINTS_PER_JOB, format_line

NAMES_PER_LINE = 8
CHUNKS = 6  # about 90,000 points: under a job's bound of 100,000, so every point is stored
METRICS_P99_GOAL_MS = 500.0
SAMPLES = 60


def _chunks(metric: bool) -> list[str]:
    """CHUNKS chunks of whole lines under LOG_CHUNK_MAX bytes: metric lines, or plain lines as long."""
    chunks, step = [], 0
    for _ in range(CHUNKS):
        lines: list[str] = []
        size = 0
        while True:
            step += 1
            line = format_line({f"m{i}": step * 0.001 + i for i in range(NAMES_PER_LINE)}, step=step)
            if not metric:
                line = "x" * len(line)
            if size + len(line) + 1 > LOG_CHUNK_MAX:
                break
            lines.append(line)
            size += len(line) + 1
        chunks.append("".join(f"{line}\n" for line in lines))
    return chunks


def ingest(home: Path) -> None:
    from tests.provisioner.test_jobs_api import create, mine, report, running_fleet, spec

    with running_fleet(home) as fleet:
        results: dict[str, tuple[float, float, int]] = {}
        for kind in ("plain", "metrics"):
            made = create(fleet, spec(f"bench-{kind}", gpus=0, cpu_count=4))
            job_id = made.json()["id"]
            node = made.json()["node"]
            [worker] = mine(fleet.heartbeat(node), job_id)
            fleet.heartbeat(node, [report(worker, "running")])
            chunks = _chunks(kind == "metrics")
            offset = 0
            cpu0, t0 = tree_cpu_s(fleet.cp.process.pid), time.perf_counter()
            for chunk in chunks:
                answer = fleet.log(node, job_id, 0, offset, chunk)
                answer.raise_for_status()
                offset += len(chunk.encode())
            wall, cpu = time.perf_counter() - t0, tree_cpu_s(fleet.cp.process.pid) - cpu0
            points = sum(c.count("\n") for c in chunks) * NAMES_PER_LINE if kind == "metrics" else 0
            assert points <= METRIC_POINTS_PER_JOB
            results[kind] = (wall, cpu, points)
            fleet.heartbeat(node, [report(worker, "exited", exit_code=0)])
        (plain_wall, plain_cpu, _), (wall, cpu, points) = results["plain"], results["metrics"]
        plain_rate = sum(len(c.encode()) for c in _chunks(False)) / plain_wall / 1e6
        rate = points / wall
        per_point_us = (cpu - plain_cpu) / points * 1e6
        print(
            f"  ingest: {points} points in {wall:.2f} s ({rate:,.0f} points/s); server CPU {cpu:.2f} s, "
            f"against {plain_cpu:.2f} s for plain lines of the same bytes ({plain_rate:.1f} MB/s) "
            f"({cpu / plain_cpu:.2f}x); {per_point_us:.1f} µs of CPU per point beyond storing the log",
            flush=True,
        )
        figure(
            "metric points ingested per second from the log path", rate, "points/s", target=10_000, bound=">"
        )
        figure("server CPU per metric point, beyond storing its log line", per_point_us, "µs")
        figure("log chunks of metric lines against plain lines, server CPU", cpu / plain_cpu, "x")


def _timed(client: httpx.Client, path: str, n: int) -> tuple[float, float, int]:
    times, size = [], 0
    for _ in range(n):
        t = time.perf_counter()
        answer = client.get(path)
        times.append((time.perf_counter() - t) * 1000)
        answer.raise_for_status()
        size = len(answer.content)
    times.sort()
    return statistics.median(times), times[min(len(times) - 1, int(len(times) * 0.99))], size


def scrape(home: Path) -> None:
    from tests.fixtures.control_plane import start_control_plane

    home.mkdir(parents=True)
    url = f"sqlite:///{home / 'bench.db'}"
    seed(url, "realistic")
    with start_control_plane(home / "home", url, pin_cpu=0) as cp, cp.client() as c:
        _timed(c, "/metrics", 3)  # warm
        p50, p99, size = _timed(c, "/metrics", SAMPLES)
        page50, page99, _ = _timed(c, "/v1/nodes?limit=500", SAMPLES)
        print(
            f"  GET /metrics at 10,000 nodes: p50 {p50:.1f} ms, p99 {p99:.1f} ms, {size / 1e3:.1f} kB; "
            f"a page of 500 nodes on the same server p99 {page99:.1f} ms (ratio {p99 / page99:.2f})",
            flush=True,
        )
        figure("GET /metrics at 10,000 nodes, p99", p99, "ms", target=METRICS_P99_GOAL_MS)
        figure("GET /metrics against a page of 500 nodes, p99 ratio", p99 / page99, "x")


CONSOLE_REGIONS = (10, 1000, 10_000)  # the compute grid shows 100 of them: the rest is counted, not drawn


def console(home: Path) -> None:
    from tests.fixtures.control_plane import start_control_plane
    from tests.provisioner.test_console import browser, sign_in

    sizes: dict[int, tuple[float, float, int]] = {}
    home.mkdir(parents=True)
    for nodes in CONSOLE_REGIONS:
        url = f"sqlite:///{home / f'console-{nodes}.db'}"
        seed(url, "realistic", nodes=nodes)
        with start_control_plane(home / f"home-{nodes}", url, pin_cpu=0) as cp, browser(cp) as client:
            sign_in(client, cp.token)
            with cp.client() as api:
                region = api.get("/v1/regions/bench-1").json()["id"]
            _timed(client, f"/regions/{region}", 2)
            sizes[nodes] = _timed(client, f"/regions/{region}", 20)
    small50, _, small_size = sizes[CONSOLE_REGIONS[0]]
    for nodes in CONSOLE_REGIONS[1:]:
        big50, big99, big_size = sizes[nodes]
        print(
            f"  console region page: 10 nodes {small_size / 1e3:.0f} kB in {small50:.1f} ms; "
            f"{nodes:,} nodes {big_size / 1e3:.0f} kB in {big50:.1f} ms (p99 {big99:.1f} ms): "
            f"{big_size / small_size:.1f}x the bytes, {big50 / small50:.1f}x the time",
            flush=True,
        )
        figure(f"console region page of {nodes:,} nodes, median", big50, "ms")
        figure(f"console region page of {nodes:,} nodes against 10, bytes", big_size / small_size, "x")
        figure(f"console region page of {nodes:,} nodes against 10, time", big50 / small50, "x")


def trust_one_ca(root: Path) -> None:
    """The control planes share one CA, which this process trusts, as the test session's fixture does
    (tests/fixtures/control_plane.py): the fleet helpers' plain httpx calls verify against it."""
    from provisioner.adapters.tls import TlsFiles, ensure_ca
    from tests.fixtures import control_plane

    files = TlsFiles(root / "ca")
    files.dir.mkdir(mode=0o700, parents=True)
    ensure_ca(files)
    control_plane._SESSION_CA.append(files)
    os.environ["SSL_CERT_FILE"] = str(files.ca_cert)


def main(argv: Any = None) -> None:
    with tempfile.TemporaryDirectory(prefix="rigbase-bench-obs-") as tmp:
        root = Path(tmp)
        trust_one_ca(root)
        ingest(root / "ingest")
        scrape(root / "scrape")
        console(root / "console")


if __name__ == "__main__":
    main()
