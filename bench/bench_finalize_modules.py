"""What a node's finalize pays per Ansible task, with the module Python it runs modules with
(minion/finalize/module_python.py: the installed, byte-compiled module_utils) against a plain Python (the
payload zip's module_utils, compiled at every task).

The real ansible-playbook, local connection and pipelining as the minion's runner sets them, runs a play of
TASKS tasks (file and copy, into a temporary directory) REPEATS times with each interpreter. Printed: the
median wall time and CPU time (this process's children) per task, and the ratio. On a node the same play
runs on the node's own CPU: a TCG guest in CI, a Jetson's ARM cores, where the ratio is what it saves."""

from __future__ import annotations

import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.results import figure
from minion.finalize.runner import inventory_for
from tests.minion.finalize_helpers import local_play_env, write_module_python

TASKS = 20
REPEATS = 3
PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"


def _play(d: Path) -> Path:
    lines = ["- hosts: node", "  gather_facts: false", "  tasks:"]
    for i in range(TASKS // 2):
        lines.append(f'    - ansible.builtin.file: {{path: "{d}/d{i}", state: directory}}')
        lines.append(f'    - ansible.builtin.copy: {{content: "{i}", dest: "{d}/d{i}/f"}}')
    play = d / "play.yml"
    play.write_text("\n".join(lines) + "\n")
    return play


def _run(d: Path, interpreter: str) -> tuple[float, float]:
    """(wall s, CPU s) of one run of the play in a fresh directory."""
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    (d / "inventory.json").write_text(json.dumps(inventory_for(None, interpreter)))
    env = local_play_env(d)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(
        [str(PLAYBOOK), "-i", str(d / "inventory.json"), str(_play(d))],
        env=env, check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="rigbase-bench-modules-") as tmp:
        ours = str(write_module_python(Path(tmp) / "bin"))
        figures: dict[str, tuple[float, float]] = {}
        for label, interpreter in (("plain python", sys.executable), ("module python", ours)):
            runs = [_run(Path(tmp) / "play", interpreter) for _ in range(REPEATS)]
            figures[label] = (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs))
    for label, (wall, cpu) in figures.items():
        print(
            f"   {label:>13}: {TASKS} tasks in {wall:.2f} s wall, {cpu:.2f} s CPU "
            f"({wall / TASKS * 1000:.0f} ms wall, {cpu / TASKS * 1000:.0f} ms CPU per task, "
            "play start included)"
        )
    (pw, pc), (mw, mc) = figures["plain python"], figures["module python"]
    print(f"   module python vs plain: {pw / mw:.2f}x faster wall, {pc / mc:.2f}x less CPU")
    figure("Ansible task with the node's module Python, wall per task", mw / TASKS * 1000, "ms")
    figure("the same with a plain Python", pw / TASKS * 1000, "ms")
    figure("module Python vs plain, speed-up", pw / mw, "×")


if __name__ == "__main__":
    main()
