"""Datasets (docs/data.md), against a real `provision serve` with the embedded object store: a 2 GB dataset
of 16 files uploaded by `provision dataset create` and fetched into a node's cache by the minion's own
ObjectCache over the node routes (HTTPS, node credential), each against a plain `cp -r` of the same files
on the same disk, measured side by side in one run; then ten jobs in one region mounting that dataset on
one node, against the bytes the node pulled (the goal: one copy). RIGBASE_BENCH_DATA_MB sets the size.
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
from minion.jobs.objects import ControlPlaneObjects, ObjectCache
from minion.join.client import ControlPlane, Enrollment
from tests.provisioner.test_jobs_api import running_fleet, spec

SIZE_MB = int(os.environ.get("RIGBASE_BENCH_DATA_MB") or 2048)
FILES = 16
JOBS = 10


class Counting:
    """The node routes, counting the bytes they answer."""

    def __init__(self, inner: ControlPlaneObjects) -> None:
        self.inner, self.bytes = inner, 0

    def manifest(self, object_id: str) -> bytes:
        return self.inner.manifest(object_id)

    def chunk(self, object_id: str, sha256: str) -> bytes:
        data = self.inner.chunk(object_id, sha256)
        self.bytes += len(data)
        return data


def _timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _cp(src: Path, dest: Path) -> float:
    took = _timed(lambda: subprocess.run(["cp", "-r", str(src), str(dest)], check=True))
    shutil.rmtree(dest)
    return took


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
        with running_fleet(root / "home") as fleet:
            os.environ["SSL_CERT_FILE"] = str(fleet.cp.ca)  # the fleet's plain httpx calls trust its CA
            cp_before = _cp(src, root / "copy")
            up = _timed(lambda: fleet.cp.provision("dataset", "create", "bench", "--source", str(src)))
            cp_after = _cp(src, root / "copy")
            cp_s = (cp_before + cp_after) / 2
            jobs = []
            with fleet.http() as http:
                for i in range(JOBS):
                    body = spec(f"reads-{i}", gpus=0, data={"datasets": ["bench"]})
                    made = http.post("/v1/jobs", json={"spec": body}).json()
                    jobs.append(http.get(f"/v1/jobs/{made['id']}").json())
            node = jobs[0]["workers"][0]["node"]
            enrollment = Enrollment(fleet.cp.url, None, ca_certificate=fleet.cp.ca.read_text())
            ident = {"node_id": fleet.node_ids[node], "node_credential": fleet.credentials[node]}
            source = Counting(ControlPlaneObjects(ControlPlane(enrollment, timeout=120), lambda: ident))
            cache = ObjectCache(root / "node-cache", source)  # type: ignore[arg-type]
            desired = fleet.heartbeat(node)
            mounts = [m for w in desired["workers"] for m in w["mounts"] if m["source_kind"] == "object"]
            first = _timed(lambda: cache.ensure(mounts[0]["object_id"], mounts[0]["digest"]))
            rest = _timed(lambda: [cache.ensure(m["object_id"], m["digest"]) for m in mounts[1:]])
            cp_again = _cp(src, root / "copy")
            with fleet.http() as http:
                for job in jobs:
                    http.post(f"/v1/jobs/{job['id']}/stop")
    mb = size / 2**20
    print(f"{mb:.0f} MB in {FILES} files: cp -r {cp_s:.2f} s ({mb / cp_s:.0f} MB/s)")
    print(
        f"  provision dataset create (upload, checked): {up:.2f} s ({mb / up:.0f} MB/s, {up / cp_s:.1f}x cp)"
    )
    print(
        f"  the node's cache, fetched and checked over HTTPS: {first:.2f} s ({mb / first:.0f} MB/s, "
        f"{first / cp_again:.1f}x cp)"
    )
    print(
        f"{len(mounts)} jobs on one node mounting it: {source.bytes / 2**20:.0f} MB pulled "
        f"({source.bytes / size:.2f} copies); the other {len(mounts) - 1} found it cached "
        f"in {rest * 1000:.1f} ms"
    )
    figure(f"upload of a {mb:.0f} MB dataset / `cp -r` of it", up / cp_s, "x")
    figure("a node caching that dataset (fetch + check) / `cp -r` of it", first / cp_again, "x")
    figure(
        f"bytes a node pulled for {len(mounts)} jobs on that dataset / its size",
        source.bytes / size,
        "x",
        target=1.0,
        bound="<=",
    )
