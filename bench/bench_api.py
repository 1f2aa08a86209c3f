"""API benchmark: the control plane on SQLite and on PostgreSQL with 10,000 nodes stored.

Measures (one uvicorn process pinned to one core, client on the other):
- node list, pages of 500 (keyset pagination, walking all 20 pages) — goal p99 < 25 ms;
- a state write (maintenance toggle: row lock, transition check, audit row, commit).
Two report profiles: 'compact' (a two-field inventory) and
'realistic', as a minion sends it: 8 GPUs with their PCIe links and sources, 6 drives, 2 NICs, CPU and
TPM, and a requirement report of 10 rules (about 6 KiB of JSON per node, a page of 500 is ~3.4 MB).
Latency is the request alone; the client parses the page after the stopwatch. On PostgreSQL the seeded
tables are analysed before measuring, as autovacuum analyses a live store's.
On PostgreSQL it also times a page's store read alone, in process, over TCP and over the Unix socket.
Before each server starts it times the same page in process (store read and JSON, no HTTP or TLS): the
machine's speed that run, to compare runs of different days by.
BENCH_API_ONLY=sqlite/compact (or =postgresql) runs one backend and profile.
Prints requests/s, p50, p99, the ratio p99 / goal (< 1.0 meets it) and the load average at the start
and at the end: the machine is shared, and other work inflates p99."""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import insert, text

from bench.results import figure
from minion.hardware.model import (
    Cpu,
    Drive,
    DriveKind,
    FormFactor,
    Gpu,
    GpuClass,
    Inventory,
    Nic,
    PcieLink,
    Tpm,
)
from provisioner.domain.inventory_gpus import gpu_summary
from provisioner.services.regions import providers, regions
from provisioner.store.engine import make_engine, make_sessionmaker
from provisioner.store.migrate import upgrade
from provisioner.store.models import AuditEvent, Node, new_id, utcnow

NODES = 10_000
PAGE = 500
LIST_GOAL_P99_MS = 25.0
WRITE_GOAL_P99_MS = 50.0
LIST_ROUNDS = 25  # x 20 pages: 500 samples, so p99 is the 5th slowest, not the 2nd of 200
WRITES = 400
IN_PROCESS_PAGES = 50
STORE_READ_ROUNDS, STORE_READS = 4, 25  # the store read alone: 100 reads each way, the ways alternating
RULES = (
    "tpm",
    "gpu_count",
    "gpu_pcie",
    "cpu_cores",
    "memory",
    "nvme_count",
    "nvme_capacity",
    "sata",
    "nic",
    "os",
)


def inventory(i: int) -> dict[str, Any]:
    """What `minion inventory --json` reports for an 8-GPU compute node (minion/hardware/model.py)."""
    gpus = [
        Gpu(
            pci_address=f"0000:{0x18 + g:02x}:00.0",
            vendor_id="10de",
            device_id="2684",
            vendor="NVIDIA",
            name="AD102 [GeForce RTX 4090]",
            model="NVIDIA GeForce RTX 4090",
            vram_bytes=25_757_220_864,
            gpu_class=GpuClass.DEVELOPMENT,
            form_factor=FormFactor.PCIE,
            catalogue_pcie_gen=4,
            driver="nvidia",
            link=PcieLink(16.0, 16, 16.0, 16, 16.0),
            sources={"model": "nvml", "vram_bytes": "nvml", "gpu_class": "catalogue"},
        )
        for g in range(8)
    ]
    drives = [
        Drive(f"nvme{d}n1", DriveKind.NVME, 3_840_755_982_336, False, None, "SAMSUNG MZQL23T8HCLS")
        for d in range(2)
    ]
    drives += [Drive(f"sd{c}", DriveKind.SATA, 4_000_787_030_016, True, 7200, "ST4000NM0035") for c in "abcd"]
    return Inventory(
        hostname=f"gpu-{i:05d}",
        cpu=Cpu(physical_cores=64, threads=128, sockets=2, model="AMD EPYC 7543 32-Core Processor"),
        memory_total_bytes=540_000_000_000,
        tpm=Tpm(present=True, major_version=2, device="/dev/tpmrm0", source="sysfs"),
        gpus=gpus,
        drives=drives,
        nics=[Nic(f"ens{n}f0", 25_000, True, f"b8:ce:f6:00:{i % 256:02x}:{n:02x}") for n in range(2)],
    ).to_json()


def requirements() -> dict[str, Any]:
    rules = [
        {"rule": r, "ok": True, "required": "at least what the rule asks", "found": "enough", "detail": ""}
        for r in RULES
    ]
    return {"ok": True, "rules": rules}


def compact(i: int) -> dict[str, Any]:
    """A summary-sized report: the page's cost without the reports' bytes."""
    return {"gpus": 4, "gpu_model": "RTX 4090"}


# inventory and requirement report of every node, by profile
PROFILES: dict[str, tuple[Callable[[int], dict[str, Any]], dict[str, Any]]] = {
    "compact": (compact, {"ok": True}),
    "realistic": (inventory, requirements()),
}


def seed(url: str, profile: str = "realistic", nodes: int = NODES) -> None:
    engine = make_engine(url)
    upgrade(url, engine)
    with make_sessionmaker(engine).begin() as s:
        providers.enable(s, "physical", {}, actor="bench")
        region = regions.create(s, "bench-1", provider="physical", actor="bench")
        now = utcnow()
        node_inventory, report = PROFILES[profile]
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
                inventory=node_inventory(i),
                **dict(zip(("gpu_count", "gpu_type"), gpu_summary(node_inventory(i)), strict=True)),
                requirements=report,
                last_heartbeat_at=now,
                created_at=now,
                updated_at=now,
                version=1,
            )
            for i in range(nodes)
        ]
        for start in range(0, nodes, 1000):
            s.execute(insert(Node), rows[start : start + 1000])
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
    if engine.dialect.name == "postgresql":
        # A live store's tables are analysed by autovacuum (after 10 % of a table changes); a table bulk
        # loaded a second ago is not, and the planner, guessing ~1,400 rows, sorts the whole table for
        # every page (24 ms instead of 1 ms at 10,000 nodes). Measure the store as it runs: analysed, and
        # vacuumed as autovacuum does after a bulk insert, rather than with autovacuum's pass over the
        # fresh 10,000 rows landing in the middle of the measurement.
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE"))
    engine.dispose()


def load_average() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def measure(
    call: Callable[[], httpx.Response], n: int, then: Callable[[httpx.Response], None]
) -> tuple[float, float, float]:
    """`n` calls: requests/s, p50 and p99 in ms of the request alone (`then` reads the answer after the
    stopwatch: a client's JSON parsing of a 3 MB page is not the server's latency)."""
    latencies = []
    started = time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        r = call()
        latencies.append((time.perf_counter() - t) * 1000)
        r.raise_for_status()
        then(r)
    elapsed = time.perf_counter() - started
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    return n / elapsed, statistics.median(latencies), p99


def _line(backend: str, what: str, figures: tuple[float, float, float], goal_ms: float) -> str:
    rps, p50, p99 = figures
    return (
        f"  {backend:10s} {what:17s}: {rps:7.1f} req/s  p50 {p50:6.1f} ms  p99 {p99:6.1f} ms  "
        f"p99/goal({goal_ms:.0f} ms) {p99 / goal_ms:.2f}"
    )


def page_in_process(url: str) -> float:
    """Median ms of a page of 500 read and written as JSON in this process (no HTTP, TLS or ASGI): the
    same work on every day, so it says how fast the machine ran this run. Its speed has moved by 3x
    between days (docs/control-plane.md, Performance): compare the HTTP figures of two runs against this."""
    from provisioner.api.node_page import nodes_page_json
    from provisioner.services.fleet import nodes

    engine = make_engine(url)
    times = []
    try:
        with make_sessionmaker(engine)() as session:
            for i in range(IN_PROCESS_PAGES + 5):
                t = time.perf_counter()
                nodes_page_json(*nodes.list_page(session, limit=PAGE))
                if i >= 5:  # the first ones warm the connection, the statement cache and the report hashes
                    times.append((time.perf_counter() - t) * 1000)
    finally:
        engine.dispose()
    return statistics.median(times)


def run(backend: str, profile: str, url: str, home: Path) -> None:
    from tests.fixtures.control_plane import start_control_plane

    seed(url, profile)
    label = f"{backend}/{profile}"
    in_process = page_in_process(url)
    print(
        f"  {label:20s} the same page in process (store read and JSON, no HTTP or TLS), median: "
        f"{in_process:.1f} ms",
        flush=True,
    )
    figure(f"{label}: a page of {PAGE} in process (the machine's speed)", in_process, "ms")
    with start_control_plane(home, url, pin_cpu=0) as cp, cp.client() as c:
        cursor: list[str | None] = [None]

        def page() -> httpx.Response:
            return c.get("/v1/nodes", params={"limit": PAGE, **({"after": cursor[0]} if cursor[0] else {})})

        def next_page(r: httpx.Response) -> None:
            body = r.json()
            assert len(body["items"]) == PAGE
            cursor[0] = body["next"]

        for _ in range(NODES // PAGE):  # warm up: one walk through every page
            next_page(page())
        cursor[0] = None
        size = len(page().content)
        print(
            f"  {label:20s} load average at start {load_average()}; a page is {size / 1e6:.2f} MB", flush=True
        )
        lists = measure(page, LIST_ROUNDS * NODES // PAGE, next_page)
        print(_line(label, f"list page of {PAGE}", lists, LIST_GOAL_P99_MS), flush=True)
        figure(
            f"{label}: a page of {PAGE} of {NODES:,} nodes over TLS, p99",
            lists[2],
            "ms",
            target=LIST_GOAL_P99_MS,
        )
        i = [0]

        def write() -> httpx.Response:
            i[0] += 1
            return c.post(f"/v1/nodes/n{i[0] % NODES:05d}/maintenance", json={"mode": "toggle"})

        writes = measure(write, WRITES, lambda r: None)
        print(_line(label, "state write", writes, WRITE_GOAL_P99_MS))
        figure(f"{label}: a state write, p99", writes[2], "ms", target=WRITE_GOAL_P99_MS)
        print(f"  {label:20s} load average at end   {load_average()}", flush=True)


def store_reads(label: str, urls: dict[str, str]) -> None:
    """A page's store read alone (services.nodes.list_page in this process: no HTTP, no JSON) over each
    way to reach the same database, the ways alternating so the machine's drift hits them alike. A
    control plane beside its PostgreSQL can use the Unix socket (docs/control-plane.md, Performance)."""
    from provisioner.services.fleet import nodes

    engines = {via: make_engine(url) for via, url in urls.items()}
    times: dict[str, list[float]] = {via: [] for via in urls}
    try:
        for _ in range(STORE_READ_ROUNDS):
            for via, engine in engines.items():
                with make_sessionmaker(engine)() as session:
                    nodes.list_page(session, limit=PAGE)  # connected and warm before the stopwatch
                    for _ in range(STORE_READS):
                        t = time.perf_counter()
                        nodes.list_page(session, limit=PAGE)
                        times[via].append((time.perf_counter() - t) * 1000)
    finally:
        for engine in engines.values():
            engine.dispose()
    medians = {via: statistics.median(ms) for via, ms in times.items()}
    first, *others = medians
    shown = ", ".join(f"{via} {ms:.1f} ms" for via, ms in medians.items())
    ratios = ", ".join(f"{via}/{first} {medians[via] / medians[first]:.2f}" for via in others)
    print(f"  {label:20s} store read of a page of {PAGE} in process, median: {shown} ({ratios})", flush=True)


def main() -> None:
    from tests.fixtures.postgres import PostgresCluster

    print(
        f"API with {NODES} nodes, over TLS; server: one uvicorn process on one core; goal: a page of {PAGE} "
        f"at p99 < {LIST_GOAL_P99_MS:.0f} ms; reports 'compact' "
        f"and 'realistic' (8 GPUs, 6 drives, 2 NICs, 10 rules: ~6 KiB a node); {os.cpu_count()} cores, "
        f"load average (1, 5, 15 min) {load_average()} at start (other work inflates p99)",
        flush=True,
    )
    only = os.environ.get("BENCH_API_ONLY", "")  # e.g. "sqlite/compact": one backend/profile
    with ExitStack() as stack:
        tmp = Path(tempfile.mkdtemp(prefix="rigbase-bench-"))
        stack.callback(shutil.rmtree, tmp, True)
        cluster: PostgresCluster | None = None
        for backend in ("sqlite", "postgresql"):
            for profile in PROFILES:
                if only and only != f"{backend}/{profile}" and only != backend:
                    continue
                home = tmp / f"{backend}-{profile}"
                home.mkdir()
                if backend == "sqlite":
                    url = f"sqlite:///{home / 'rigbase.db'}"
                else:
                    cluster = cluster or stack.enter_context(PostgresCluster())
                    url = cluster.create_database()
                run(backend, profile, url, home)
                if cluster is not None and backend == "postgresql":
                    store_reads(f"{backend}/{profile}", {"TCP": url, "Unix socket": cluster.socket_url(url)})
    print(f"load average at end {load_average()}", flush=True)


if __name__ == "__main__":
    main()
