"""The minion's liveness guards (minion/watchdog.py): systemd's notify protocol over a real unix datagram
socket, and the stack dump a stalled loop prints, in a real child process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from minion.watchdog import DEFAULT_STALL_S, Watchdog, notify

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def notify_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> socket.socket:
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(2)
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    return sock


def _received(sock: socket.socket) -> list[str]:
    out = []
    sock.setblocking(False)
    while True:
        try:
            out.append(sock.recv(4096).decode())
        except BlockingIOError:
            return out


def test_under_systemds_watchdog_every_pass_pings(
    notify_socket: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "300000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    dog = Watchdog.from_environment()
    assert dog.systemd_s == 300 and dog.stall_s == 150  # the stacks print halfway to systemd's abort
    try:
        dog.start()
        dog.alive()
    finally:
        dog.stop()
    assert _received(notify_socket) == ["READY=1", "WATCHDOG=1", "WATCHDOG=1", "STOPPING=1"]


def test_a_watchdog_meant_for_another_process_is_not_pinged(
    notify_socket: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "300000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))  # e.g. inherited from a parent
    dog = Watchdog.from_environment()
    assert dog.systemd_s is None and dog.stall_s == DEFAULT_STALL_S
    dog.alive()
    dog.stop()
    assert _received(notify_socket) == ["STOPPING=1"]


def test_without_systemd_nothing_is_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert notify("WATCHDOG=1") is False


def test_a_stalled_loop_prints_where_every_thread_hangs() -> None:
    program = textwrap.dedent(
        """
        import threading, time
        from minion.watchdog import Watchdog

        def stuck_in_a_tpm_call():
            time.sleep(5)

        dog = Watchdog(stall_s=0.5)
        dog.start()
        threading.Thread(target=stuck_in_a_tpm_call, name="finalize", daemon=True).start()
        time.sleep(1.5)  # the main loop never comes round to alive()
        """
    )
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
    done = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert "Timeout (0:00:00.500000)!" in done.stderr
    assert "stuck_in_a_tpm_call" in done.stderr and "line 11 in <module>" in done.stderr, done.stderr


def test_a_loop_that_comes_round_prints_nothing() -> None:
    program = textwrap.dedent(
        """
        import time
        from minion.watchdog import Watchdog

        dog = Watchdog(stall_s=0.5)
        dog.start()
        for _ in range(6):
            time.sleep(0.2)
            dog.alive()
        dog.stop()
        time.sleep(0.7)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr


def test_a_reader_that_stopped_reading_never_blocks_the_loop(notify_socket: socket.socket) -> None:
    # a unix datagram queue holds a few hundred messages; a blocking send would stall here for good
    sent = [notify("WATCHDOG=1") for _ in range(5000)]
    assert sent[0] is True and sent[-1] is False  # the first queued, the overflow dropped, none waited
