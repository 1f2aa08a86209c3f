"""One play at a time per state directory, and no leftover play from a killed minion.

ansible-runner starts ansible-playbook in its own session on a pty; when the minion is SIGKILLed the pty
closes and the play usually dies of SIGHUP, but nothing guarantees it. So the play's pid is recorded with
the process start time (a recycled pid is never mistaken for it) and stopped before the next run, and a
flock makes a second concurrent run (`minion finalize apply-saved` while `minion run` applies) a
RunBusy instead of two plays on one machine."""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

from contracts.processes import process_start_time, terminate

log = logging.getLogger(__name__)

STOP_GRACE_SECONDS: Final = 5.0


class RunBusy(RuntimeError):
    """Another finalize run holds this state directory's lock."""


def record_pid(pid_file: Path, pid: int) -> None:
    start = process_start_time(pid)
    if start is not None:
        pid_file.write_text(f"{pid} {start}\n")


def stop_leftover(pid_file: Path) -> bool:
    """Stop the ansible-playbook an interrupted run left behind (its whole process group); True if one
    was running."""
    try:
        pid, start = (int(f) for f in pid_file.read_text().split())
    except (OSError, ValueError):
        pid_file.unlink(missing_ok=True)
        return False
    found = process_start_time(pid) == start
    if found:
        log.warning("stopping leftover ansible-playbook %d from an interrupted finalize", pid)
        terminate(
            lambda sig: os.killpg(os.getpgid(pid), sig),
            lambda: process_start_time(pid) == start,
            grace_s=STOP_GRACE_SECONDS,
            kill_wait_s=STOP_GRACE_SECONDS,
            poll_s=0.1,
        )
    pid_file.unlink(missing_ok=True)
    return found


@contextmanager
def exclusive(lock_file: Path) -> Iterator[None]:
    lock_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(lock_file, "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunBusy(f"a finalize run already holds {lock_file}; wait for it to finish.") from None
        yield
