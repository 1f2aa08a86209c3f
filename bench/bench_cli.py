"""`provision` start-up: what one command costs before it sends its request.

Every operator command, every script that calls the CLI in a loop and the test suite (which runs the real
CLI as a subprocess: about 50 commands in 90 s of its CLI tests) pays the interpreter start plus the
imports of the code it runs. The root group imports a command group's module only when the command line
names it (provisioner/cli/main.py, GROUPS), so a command loads its own group and the shared base, and only
`provision --help`, which lists every group with its summary, loads them all. Printed: the median wall and
CPU time of a command that loads one group (`provision token --help`) beside `provision --help` (every
group, what every command cost while the root imported them all), the bare interpreter for scale, and the
ratio. Then `provision node list` against a warm control plane on loopback (`provision serve
--insecure-http` in the bench's own home), the start-up and one request together, against the goal of
300 ms wall on this machine.
"""

from __future__ import annotations

import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.results import figure

ROOT = Path(__file__).resolve().parents[1]
PROVISION = ROOT / ".venv" / "bin" / "provision"
REPEATS = 15


def _run(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds (user + system of the child) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _median(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    _run(argv, env)  # warm the page cache and the bytecode
    runs = [_run(argv, env) for _ in range(REPEATS)]
    return statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs)


GOAL_S = 0.300  # `node list` against a warm server (kubectl answers in about 0.1 s)


def _warm_node_list(env: dict[str, str]) -> tuple[float, float]:
    """The median `provision node list` against a control plane that has answered it once already."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [str(PROVISION), "serve", "--insecure-http", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while subprocess.run([str(PROVISION), "node", "list"], env=env, capture_output=True).returncode != 0:
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("the bench's control plane did not start")
            time.sleep(0.5)
        return _median([str(PROVISION), "node", "list"], env)
    finally:
        server.terminate()
        server.wait(30)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="rigbase-bench-cli-") as home:
        env = {**os.environ, "RIGBASE_HOME": home, "COLUMNS": "100"}
        for name in ("RIGBASE_URL", "RIGBASE_TOKEN", "RIGBASE_CA_CERT"):
            env.pop(name, None)
        cases = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "provision token --help (one group)": [str(PROVISION), "token", "--help"],
            "provision --help (every group)": [str(PROVISION), "--help"],
        }
        figures = {name: _median(argv, env) for name, argv in cases.items()}
        figures["provision node list (warm server)"] = _warm_node_list(env)
    print(f"   {REPEATS} runs each, median; load average {os.getloadavg()[0]:.2f}")
    for name, (wall, cpu) in figures.items():
        print(f"   {name:<38} wall {wall * 1000:6.0f} ms   cpu {cpu * 1000:6.0f} ms")
    one = figures["provision token --help (one group)"]
    every = figures["provision --help (every group)"]
    print(f"   one group / every group: wall {one[0] / every[0]:.2f}x, cpu {one[1] / every[1]:.2f}x")
    for name, (wall, _cpu) in figures.items():
        figure(f"`{name}`, median wall", wall * 1000, "ms")
    figure(
        "CPU at start-up: a command that loads one group / `provision --help` (all groups)",
        one[1] / every[1],
        "×",
    )
    listed = figures["provision node list (warm server)"][0]
    print(f"   node list (warm server) / goal {GOAL_S * 1000:.0f} ms: {listed / GOAL_S:.2f}x")
    figure(
        "`provision node list` against a warm server / the 300 ms goal",
        listed / GOAL_S,
        "×",
        target=1.0,
    )


if __name__ == "__main__":
    main()
