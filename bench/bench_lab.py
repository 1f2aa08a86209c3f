"""The local lab (docs/lab.md): `provision lab up --nodes 2` warm (cached Debian root) and idempotent,
the per-node join phases from the nodes' own history, and `provision lab down`. Then, on four nodes, the
time from `job create` to every worker running for a gang of 8 one-GPU workers over the four nodes,
against one worker, each from the job's own history. Needs root.

The Debian root is shared with the tests through RIGBASE_TEST_ROOTFS_CACHE (default .cache/rootfs);
a first run on a machine builds it and reports that run as cold.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.results import figure

REPO = Path(__file__).resolve().parents[1]
PROVISION = Path(sys.executable).parent / "provision"
NODES = 2


def _run(home: Path, *args: str) -> tuple[float, subprocess.CompletedProcess[str]]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RIGBASE_URL", "RIGBASE_TOKEN", "RIGBASE_DATABASE_URL")
    }
    started = time.perf_counter()
    proc = subprocess.run(
        [str(PROVISION), *args],
        env=env | {"RIGBASE_HOME": str(home), "TSS2_LOG": "all+none"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode != 0:
        raise SystemExit(f"provision {' '.join(args)} failed: {proc.stderr[-2000:]}")
    return time.perf_counter() - started, proc


def _at(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


GANG_NODES = 4  # 2 GPUs each: a gang of 8 one-GPU workers fills them
GANG = 8
REPEATS = 3


def _show(home: Path, name: str) -> dict[str, Any]:
    return dict(json.loads(_run(home, "job", "show", name, "--json")[1].stdout))


def _to_running_s(home: Path, name: str, workers: int, datasets: tuple[str, ...] = ()) -> float:
    """Create a job of `workers` one-GPU workers; seconds from its creation to every worker running (its
    history: the job's first line to its `running` line, both the control plane's clock). Then stop it."""
    spec = home / f"{name}.yaml"
    body = {
        "name": name,
        "type": "training",
        "kind": "gang",
        "resources": {"gpu_types": ["RTX A6000"], "gpu_count": 1},
        "workers": ["sleep 120"] * workers,
        "environment": {"image": "localhost/rigbase-lab:latest"},
        "data": {"datasets": list(datasets)},
    }
    spec.write_text(json.dumps(body))
    _run(home, "job", "create", "-f", str(spec), "-y")
    deadline = time.monotonic() + 300
    while _show(home, name)["state"] != "running":
        if time.monotonic() > deadline:
            raise SystemExit(f"bench_lab: job {name} did not run within 300 s")
        time.sleep(0.2)
    lines = json.loads(_run(home, "job", "history", name, "--json")[1].stdout)
    mine = [h for h in lines if h["name"] == name]
    took = _at(next(h["at"] for h in mine if h["to_state"] == "running")) - _at(mine[0]["at"])
    _run(home, "job", "stop", name)
    while (
        json.loads(_run(home, "job", "show", name, "--json")[1].stdout)["workers"][-1]["state"] != "stopped"
    ):
        time.sleep(0.5)  # its GPUs free again before the next one
    return took


def _gang_start(home: Path) -> None:
    _run(home, "lab", "up", "--nodes", str(GANG_NODES))
    for n in range(1, GANG_NODES + 1):
        _run(home, "node", "maintenance", f"node-{n}", "off")
    one, gang = [], []
    for i in range(REPEATS):  # side by side, alternating: the same machine load for both
        one.append(_to_running_s(home, f"one-{i}", 1))
        gang.append(_to_running_s(home, f"gang-{i}", GANG))
    one_s, gang_s = sorted(one)[len(one) // 2], sorted(gang)[len(gang) // 2]
    print(
        f"create -> every worker running, median of {REPEATS}: one worker {one_s:.2f} s, "
        f"a gang of {GANG} over {GANG_NODES} nodes {gang_s:.2f} s ({gang_s / one_s:.2f}x)"
    )
    figure("create -> running, one worker", one_s, "s")
    figure(f"create -> running, a gang of {GANG} over {GANG_NODES} nodes / one worker", gang_s / one_s, "x")


def _data_start(home: Path) -> None:
    """A one-worker job with a 256 MB dataset, the first time (the node fetches it) and then with the
    node's copy, against the same job without data, alternating on one node."""
    data = home / "bench-dataset"
    data.mkdir()
    for i in range(4):
        (data / f"part-{i}.bin").write_bytes(os.urandom(64 * 2**20))
    _run(home, "dataset", "create", "bench-256", "--source", str(data))
    for n in range(2, GANG_NODES + 1):  # one node: the dataset's second use finds it there
        _run(home, "node", "maintenance", f"node-{n}", "on")
    first = _to_running_s(home, "data-first", 1, ("bench-256",))
    plain, cached = [], []
    for i in range(REPEATS):
        plain.append(_to_running_s(home, f"plain-{i}", 1))
        cached.append(_to_running_s(home, f"cached-{i}", 1, ("bench-256",)))
    plain_s, cached_s = sorted(plain)[len(plain) // 2], sorted(cached)[len(cached) // 2]
    print(
        f"create -> running with a 256 MB dataset: first (fetched by the node) {first:.2f} s, cached "
        f"{cached_s:.2f} s; without data {plain_s:.2f} s (median of {REPEATS})"
    )
    figure("create -> running, a 256 MB dataset the node holds / no data", cached_s / plain_s, "x")
    figure("create -> running, a 256 MB dataset fetched first / no data", first / plain_s, "x")


def main() -> None:
    if os.geteuid() != 0:
        print("bench_lab: skipped, the lab needs root (network namespaces)")
        return
    cache = Path(os.environ.get("RIGBASE_TEST_ROOTFS_CACHE") or REPO / ".cache" / "rootfs")
    cache.mkdir(parents=True, exist_ok=True)
    warm = any(cache.glob("*/.rigbase-complete"))
    with tempfile.TemporaryDirectory(prefix="rigbase-bench-lab-") as tmp:
        home = Path(tmp)
        (home / "cache").mkdir()
        (home / "cache" / "rootfs").symlink_to(cache)
        try:
            up_s, up = _run(home, "lab", "up", "--nodes", str(NODES), "--json")
            again_s, _ = _run(home, "lab", "up", "--nodes", str(NODES))
            state = json.loads((home / "lab" / "state.json").read_text())
            print(
                f"lab up --nodes {NODES} "
                f"({'warm: cached root' if warm else 'cold: debootstrap included'}): {up_s:.1f} s"
            )
            print(f"lab up again (everything up, nothing to do): {again_s:.2f} s")
            figure(
                f"`provision lab up --nodes {NODES}` ({'warm' if warm else 'cold: debootstrap included'})",
                up_s,
                "s",
            )
            figure("`provision lab up` again, nothing to do", again_s, "s")
            print(
                "node     start->adopted  adopted->enrolling  enrolling->provisioning  "
                "playbook  adopted->maintenance"
            )
            for node in json.loads(up.stdout)["nodes"]:
                _, hist = _run(home, "node", "history", node["name"], "--json")
                moves = {
                    h["to_state"]: _at(h["at"])
                    for h in json.loads(hist.stdout)
                    if h["from_state"] != h["to_state"]
                }
                lab = state["nodes"][node["name"]]
                print(
                    f"{node['name']:<8} {moves['new'] - lab['started_at']:>14.1f}  "
                    f"{moves['enrolling'] - moves['new']:>18.2f}  "
                    f"{moves['provisioning'] - moves['enrolling']:>23.2f}  "
                    f"{moves['maintenance'] - moves['provisioning']:>8.1f}  "
                    f"{lab['ready_at'] - lab['added_at']:>20.1f}"
                )
            print(
                "(start->adopted: swtpm, umockdev, join attempt, listed pending, root cloned, "
                "added by minion_id; a reconciler pass finalizes its nodes one after another, "
                "so a node may wait for another's playbook)"
            )
            _gang_start(home)
            _data_start(home)
        finally:
            down_s, _ = _run(home, "lab", "down", "--yes")
            print(f"lab down: {down_s:.1f} s")
            figure("`provision lab down`", down_s, "s")
