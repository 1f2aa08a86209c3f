"""Who holds a TCP port on this host, for `provision serve`'s one-line refusal: the kernel's socket table
(/proc/net/tcp, tcp6) gives the listening socket's inode, and the process whose descriptor is that socket
is its holder. Linux only; elsewhere, or without the right to read another user's descriptors, None."""

from __future__ import annotations

import os
from pathlib import Path

LISTEN = "0A"  # st in /proc/net/tcp: TCP_LISTEN


def _listening_inodes(port: int, proc: Path) -> set[str]:
    inodes: set[str] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def holder(port: int, proc: Path = Path("/proc")) -> str | None:
    """`pid N (COMMAND LINE)` of the process listening on `port`, or None when it cannot be told."""
    inodes = _listening_inodes(port, proc)
    if not inodes:
        return None
    wanted = {f"socket:[{inode}]" for inode in inodes}
    for pid in (p for p in os.listdir(proc) if p.isdigit()):
        try:
            fds = os.listdir(proc / pid / "fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(proc / pid / "fd" / fd) in wanted:
                    raw = (proc / pid / "cmdline").read_bytes()
                    command = " ".join(raw.decode(errors="replace").split("\0")).strip()
                    return f"pid {pid} ({command[:120] or 'no command line'})"
            except OSError:
                continue
    return "another user's process"
