"""Liveness of `minion run`: a stalled main loop is diagnosed on the console and restarted by systemd.

A node's minion is its only way back to the control plane (nothing connects in), so a loop stuck in one
call — a TPM command or a subprocess that never returns — would leave a node silent until someone walks
to it. Two guards, both driven by `Watchdog.alive()` once per join attempt and per heartbeat:

- systemd's watchdog (the image's unit sets `WatchdogSec=`): every `alive()` sends `WATCHDOG=1` over the
  notify socket. When the pings stop, systemd aborts the minion (SIGABRT) and `Restart=on-failure` starts
  a fresh one, which joins or heartbeats again with its saved credential.
- faulthandler: enabled at start, so that abort prints every thread's Python stack to stderr (the console
  and the journal). Where no systemd watchdog runs (a lab minion), a loop stalled for `stall_s` prints
  the same stacks once, so the operator still sees where it hangs.

The notify protocol is one datagram to the unix socket in $NOTIFY_SOCKET (sd_notify(3)); the minion
ships no libsystemd binding for that, so it is written out here.
"""

from __future__ import annotations

import faulthandler
import os
import socket
import sys
from dataclasses import dataclass
from typing import Final

DEFAULT_STALL_S: Final = 300.0  # no systemd watchdog: print the stacks after this long without a ping


def _notify_address() -> str | None:
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return None
    return "\0" + address[1:] if address.startswith("@") else address  # '@': Linux abstract namespace


def _systemd_watchdog_s() -> float | None:
    """systemd's watchdog period for this process (WATCHDOG_USEC, when WATCHDOG_PID is us or unset)."""
    usec, pid = os.environ.get("WATCHDOG_USEC"), os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 1_000_000
    except ValueError:
        return None


def notify(message: str) -> bool:
    """Send one sd_notify message (e.g. "READY=1", "WATCHDOG=1"); False when not run by systemd."""
    address = _notify_address()
    if address is None:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            # never wait on the reader: a full queue must not stall the loop this guard watches
            s.setblocking(False)
            s.connect(address)
            s.send(message.encode())
    except OSError:
        return False  # systemd went away (shutdown) or is not reading: nothing to tell
    return True


@dataclass
class Watchdog:
    """`alive()` from the main loop; `start()` once, `stop()` when the loop ends on purpose."""

    stall_s: float = DEFAULT_STALL_S
    systemd_s: float | None = None

    @classmethod
    def from_environment(cls) -> Watchdog:
        systemd_s = _systemd_watchdog_s()
        # under systemd the abort prints the stacks; the timer is only a second chance at half the period
        return cls(stall_s=systemd_s / 2 if systemd_s else DEFAULT_STALL_S, systemd_s=systemd_s)

    def start(self) -> None:
        faulthandler.enable(file=sys.stderr, all_threads=True)
        notify("READY=1")
        self.alive()

    def alive(self) -> None:
        if self.systemd_s is not None:
            notify("WATCHDOG=1")
        # re-armed on every ping: fires only when the loop has not come round for stall_s
        faulthandler.dump_traceback_later(self.stall_s, repeat=False, file=sys.stderr)

    def stop(self) -> None:
        faulthandler.cancel_dump_traceback_later()
        notify("STOPPING=1")
