"""The homes of the control planes running on this host, for the CLI's "no control plane configured"
answer: a shell that lost RIGBASE_HOME is told which home to set instead of being invited to start a
second control plane. Read from /proc: each `provision serve` process and its RIGBASE_HOME (the default
home when it has none). Another user's process cannot be read and is not named."""

from __future__ import annotations

import os
from pathlib import Path


def _environment(pid: str, proc: Path) -> dict[str, str]:
    raw = (proc / pid / "environ").read_bytes()
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def running_homes(default: Path, proc: Path = Path("/proc")) -> list[tuple[Path, int]]:
    """(home, pid) of every `provision serve` on this host this user may read, the newest first."""
    found: list[tuple[Path, int]] = []
    me = str(os.getpid())
    for pid in sorted((p for p in os.listdir(proc) if p.isdigit() and p != me), key=int, reverse=True):
        try:
            argv = (proc / pid / "cmdline").read_bytes().split(b"\0")
            names = [Path(a.decode(errors="replace")).name for a in argv[:3]]
            if "provision" not in names or b"serve" not in argv:
                continue
            home = _environment(pid, proc).get("RIGBASE_HOME")
        except OSError:
            continue
        found.append((Path(home) if home else default, int(pid)))
    return found
