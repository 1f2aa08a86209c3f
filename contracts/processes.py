"""Processes by pid, as the minion and the lab both stop them: a pid with its start time names one
process for good, and a stop is SIGTERM, a grace period, then SIGKILL."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path


def process_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks (field 22 of /proc/PID/stat); None once it is gone or a
    zombie. With the pid it names one process for good: a reused pid has another start time."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()  # comm may hold ")"
    except OSError:
        return None
    return None if fields[0] == "Z" else int(fields[19])


def terminate(
    send: Callable[[int], None],
    alive: Callable[[], bool],
    *,
    grace_s: float,
    kill_wait_s: float = 2.0,
    poll_s: float = 0.02,
) -> bool:
    """SIGTERM, up to `grace_s` for it to end, then SIGKILL and up to `kill_wait_s`. `send(sig)` delivers
    the signal (to a pid, a process group, every process of a namespace; ProcessLookupError: gone) and
    `alive()` says whether it still runs. True once it has ended."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, kill_wait_s)):
        if not alive():
            return True
        try:
            send(sig)
        except ProcessLookupError:
            return True
        deadline = time.monotonic() + wait
        while alive() and time.monotonic() < deadline:
            time.sleep(poll_s)
    return not alive()
