"""What the benchmarks share: their command line, the CPU a process tree spent, and a SIGTERM that
unwinds every `finally` (servers, swtpms and PostgreSQL started by a bench stop with it)."""

from __future__ import annotations

import os
import signal
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = defaultdict(list)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            tree[int(stat.rsplit(")", 1)[1].split()[1])].append(int(entry.name))
    return tree


def tree_cpu_s(root: int) -> float:
    """CPU seconds (user + system) of a process and all its descendants so far, those that have ended
    included (a process's cutime and cstime hold the children it reaped: PostgreSQL's backends that
    ended during a run, whose CPU was missing from the figure before)."""
    tree, total, todo = _children(), 0.0, [root]
    tick = os.sysconf("SC_CLK_TCK")
    while todo:
        pid = todo.pop()
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(f) for f in fields[11:15]) / tick  # utime, stime, cutime, cstime
        todo += tree.get(pid, [])
    return total


def options_from_argv(argv: Sequence[str]) -> list[str]:
    """The options after the module names: `python -m bench fleet_heartbeats --nodes 200` hands every
    benchmark the whole command line (bench/__main__.py), whose names come first."""
    return list(next((argv[i:] for i, a in enumerate(argv) if a.startswith("--")), []))


@contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """SIGTERM raises SystemExit in the main thread, so every `finally` (swtpms, server, PostgreSQL) runs."""
    previous = signal.signal(signal.SIGTERM, _exit_on_signal)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(f"stopped by signal {signum}")
