"""Datasets (docs/data.md), against a real `provision serve` with the embedded object store: a 2 GB dataset
of 16 files uploaded by `provision dataset create` and fetched into a central region's cache by its storage
node's own ObjectCache and cache agent over the node routes (HTTPS, node credential), each against a plain
`cp -r` of the same files on the same disk, measured side by side in one run; then ten jobs spread over
the region's three compute nodes mounting that dataset from the storage node's export, against the bytes
the region pulled (the goal: one copy). RIGBASE_BENCH_DATA_MB sets the size.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.results import figure
from minion.jobs.cache_agent import CacheAgent
from tests.provisioner.test_jobs_api import Fleet, spec
from tests.provisioner.test_regional_cache import agent_of, beat, regional_fleet

SIZE_MB = int(os.environ.get("RIGBASE_BENCH_DATA_MB") or 2048)
FILES = 16
JOBS = 10
HUB_NODES = 3


def _timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _cp(src: Path, dest: Path) -> float:
    took = _timed(lambda: subprocess.run(["cp", "-r", str(src), str(dest)], check=True))
    shutil.rmtree(dest)
    return took


def _fill(fleet: Fleet, agent: CacheAgent) -> None:
    """The storage node's beats, its cache agent answering, until it holds what the region's jobs use."""
    report: dict[str, Any] = {}
    while True:
        wanted = beat(fleet, "st-1", {"objects": report} if report else None)["objects"]
        report = agent.handle(wanted)
        if wanted["objects"] and all(o["digest"] in report["held"] for o in wanted["objects"]):
            beat(fleet, "st-1", {"objects": report})  # the control plane learns it holds them
            return
        time.sleep(0.05)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="rigbase-bench-data-") as tmp:
        root = Path(tmp)
        src = root / "dataset"
        src.mkdir()
        piece = SIZE_MB * 2**20 // FILES
        for i in range(FILES):  # incompressible, distinct chunks
            with (src / f"part-{i:02d}.bin").open("wb") as fh:
                for _ in range(piece // 2**20):
                    fh.write(os.urandom(2**20))
        size = sum(p.stat().st_size for p in src.iterdir())
        with regional_fleet(root / "home", hub_nodes=HUB_NODES, threads=16) as fleet:
            os.environ["SSL_CERT_FILE"] = str(fleet.cp.ca)  # the fleet's plain httpx calls trust its CA
            cp_before = _cp(src, root / "copy")
            up = _timed(lambda: fleet.cp.provision("dataset", "create", "bench", "--source", str(src)))
            cp_after = _cp(src, root / "copy")
            cp_s = (cp_before + cp_after) / 2
            jobs = []
            with fleet.http() as http:
                for i in range(JOBS):
                    body = spec(f"reads-{i}", gpus=0, cpu_count=4, region="hub", data={"datasets": ["bench"]})
                    made = http.post("/v1/jobs", json={"spec": body}).json()
                    jobs.append(http.get(f"/v1/jobs/{made['id']}").json())
            export = root / "st-1-export" / "objects"
            storage, pulled = agent_of(fleet, "st-1", export, timeout=120)
            first = _timed(lambda: _fill(fleet, storage))
            cp_again = _cp(src, root / "copy")
            nodes = sorted({w["node"] for j in jobs for w in j["workers"]})
            read, mounted = 0, 0
            started = time.perf_counter()
            for node in nodes:  # each compute node reads the storage node's export (its NFS mount)
                shared, counted = agent_of(fleet, node, export, timeout=120)
                desired = beat(fleet, node)
                shared.handle(desired["objects"])
                for m in [m for w in desired["jobs"]["workers"] for m in w["mounts"] if m["object_id"]]:
                    shared.cache.ensure(m["object_id"], m["digest"])
                    mounted += 1
                read += counted.sent
            rest = time.perf_counter() - started
            with fleet.http() as http:
                for job in jobs:
                    http.post(f"/v1/jobs/{job['id']}/stop")
    total = pulled.sent + read
    mb = size / 2**20
    print(f"{mb:.0f} MB in {FILES} files: cp -r {cp_s:.2f} s ({mb / cp_s:.0f} MB/s)")
    print(
        f"  provision dataset create (upload, checked): {up:.2f} s ({mb / up:.0f} MB/s, {up / cp_s:.1f}x cp)"
    )
    print(
        f"  the region's cache on its storage node, fetched and checked over HTTPS: {first:.2f} s "
        f"({mb / first:.0f} MB/s, {first / cp_again:.1f}x cp)"
    )
    print(
        f"{mounted} jobs on {len(nodes)} compute nodes of the region mounting it: {total / 2**20:.0f} MB "
        f"pulled ({total / size:.2f} copies); the compute nodes found it in the region's cache "
        f"in {rest * 1000:.1f} ms"
    )
    figure(f"upload of a {mb:.0f} MB dataset / `cp -r` of it", up / cp_s, "x")
    figure(
        "a region's storage node caching that dataset (fetch + check) / `cp -r` of it", first / cp_again, "x"
    )
    figure(
        f"bytes a central region pulled for {mounted} jobs on {len(nodes)} nodes on that dataset / its size",
        total / size,
        "x",
        target=1.0,
        bound="<=",
    )
