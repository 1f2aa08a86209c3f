"""Inventory + requirement check on a big machine: 16 GPUs and 24 drives, target < 1 s.

The machine is a umockdev testbed (the same builder the tests use), so the figure includes the real
pyudev enumeration through libudev, the catalogue lookup, /proc parsing and every rule. Printed:
the first (cold) collect+check in a fresh interpreter, the median of warm repeats, and the whole
`minion check --json` command under umockdev-run for scale (interpreter start and testbed setup included).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.results import figure
from tests.fixtures.umockdev import build_testbed, minion_executable

TARGET_S = 1.0
REPEATS = 5

PROFILE = {
    "name": "bench-16gpu-24drive",
    "host": {
        "hostname": "bench",
        "memory_gib": 2015.3,
        "sockets": 2,
        "cores_per_socket": 64,
        "threads_per_core": 2,
    },
    "gpus": [{"id": "10de:2331", "count": 16, "gen": 5, "width": 16}],
    "nvme": [{"count": 8, "bytes": 3840755982336}],
    "sata": [{"count": 16, "bytes": 4000787030016, "rotational": True, "rpm": 7200}],
    "tpm": {"version": 2},
    "nics": [{"name": "ens1f0np0", "speed": 100000}, {"name": "ens1f1np1", "speed": 100000}],
}

# Runs inside the testbed: times collect()+check() in-process, cold first, then warm repeats.
_PROBE = """
import json, sys, time
from pathlib import Path
started = time.perf_counter()
from minion.hardware.inventory import collect
from minion.hardware.requirements import check
imported = time.perf_counter() - started
times = []
for _ in range({repeats} + 1):
    t0 = time.perf_counter()
    inventory = collect(Path(sys.argv[1]))
    report = check(inventory, "local", public_jobs=True)
    times.append(time.perf_counter() - t0)
print(json.dumps({{"import_and_first": imported + times[0], "warm": times[1:], "gpus": len(inventory.gpus),
                  "drives": len(inventory.drives), "rules": len(report.rules)}}))
"""


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="rigbase-bench-inventory-") as tmp:
        testbed = build_testbed(PROFILE, Path(tmp))
        probe = subprocess.run(
            testbed.command(sys.executable, "-c", _PROBE.format(repeats=REPEATS), str(testbed.host_root)),
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parents[1],
        )
        figures = json.loads(probe.stdout.strip().splitlines()[-1])
        started = time.perf_counter()
        command = testbed.run("check", "--json", "--public-jobs", "--storage-mode", "local")
        command_s = time.perf_counter() - started
    assert (figures["gpus"], figures["drives"]) == (16, 24), figures
    assert command.returncode in (0, 1), command.stderr
    warm = statistics.median(figures["warm"])
    cold = figures["import_and_first"]
    print(f"   machine: {figures['gpus']} GPUs, {figures['drives']} drives, {figures['rules']} rules checked")
    shape = f"{figures['gpus']} GPUs and {figures['drives']} drives"
    figure(f"inventory + check, {shape}, warm", warm * 1000, "ms", target=TARGET_S * 1000)
    figure(f"inventory + check, {shape}, first call incl. imports", cold * 1000, "ms", target=TARGET_S * 1000)
    print(
        f"   inventory+check, first call incl. imports: {cold * 1000:.1f} ms "
        f"(target {TARGET_S * 1000:.0f} ms, ratio {TARGET_S / cold:.1f}x under)"
    )
    print(
        f"   inventory+check, warm median of {REPEATS}: {warm * 1000:.1f} ms "
        f"(ratio {TARGET_S / warm:.1f}x under target)"
    )
    print(
        f"   `{minion_executable().name} check --json` under umockdev-run, wall: {command_s * 1000:.0f} ms "
        "(interpreter start and testbed setup included)"
    )


if __name__ == "__main__":
    main()
