"""The local lab (docs/lab.md): `provision lab up --nodes 2` warm (cached Debian root) and idempotent,
the per-node join phases from the nodes' own history, and `provision lab down`. Needs root.

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
        finally:
            down_s, _ = _run(home, "lab", "down", "--yes")
            print(f"lab down: {down_s:.1f} s")
            figure("`provision lab down`", down_s, "s")
