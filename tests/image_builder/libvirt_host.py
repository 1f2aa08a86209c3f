"""libvirtd for the Vagrant tests, started by the test when none runs (a bare CI machine: package scripts
may not start daemons there) and stopped afterwards.

It runs in a network namespace of its own with only `lo`: every QEMU it starts, and every network it
would make, lives there too, so a VM on QEMU's user network reaches that namespace's loopback and nothing
of the host's. `forward_into` bridges one of its loopback ports to a port on the host's loopback (the
control plane), through a unix socket: both ends stay on loopback."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

LIBVIRT_URI = "qemu:///system"
IMAGES = Path("/var/lib/libvirt/images")


def virsh(*args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["virsh", "-c", LIBVIRT_URI, *args], capture_output=True, text=True, timeout=timeout, check=check
    )


@dataclass(frozen=True)
class Libvirtd:
    pid: int | None  # None: a libvirtd this test did not start (on the host's network)

    @property
    def netns(self) -> Path | None:
        return None if self.pid is None else Path(f"/proc/{self.pid}/ns/net")


def _tools() -> None:
    for tool in ("vagrant", "virsh", "libvirtd", "virtlogd", "socat", "nsenter"):
        if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
            pytest.fail(
                f"{tool} is missing: scripts/install-deps.sh installs vagrant, vagrant-libvirt, libvirt"
            )


@contextmanager
def libvirtd() -> Iterator[Libvirtd]:
    """The libvirtd to use: one already running (pid None), or one started here in its own netns."""
    _tools()
    if virsh("version", check=False).returncode == 0:
        yield Libvirtd(None)
        return
    logd = Path("/run/virtlogd.pid")
    subprocess.run(["/usr/sbin/virtlogd", "-d"], check=True, timeout=30)
    proc = subprocess.Popen(
        ["unshare", "--net", "--", "sh", "-c", "ip link set lo up && exec /usr/sbin/libvirtd"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while virsh("version", check=False).returncode != 0:
            assert proc.poll() is None, f"libvirtd exited with {proc.returncode}"
            assert time.monotonic() < deadline, "libvirtd started but does not answer on qemu:///system"
            time.sleep(0.2)
        yield Libvirtd(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if logd.exists():
            subprocess.run(["kill", logd.read_text().strip()], check=False)


@contextmanager
def forward_into(daemon: Libvirtd, port: int, to_port: int, scratch: Path) -> Iterator[None]:
    """Inside libvirtd's namespace, 127.0.0.1:`port` leads to the host's 127.0.0.1:`to_port`."""
    assert daemon.netns is not None, "a libvirtd on the host's network needs no forward"
    sock = scratch / f"fwd-{uuid.uuid4().hex[:8]}.sock"
    host_side = subprocess.Popen(
        ["socat", f"UNIX-LISTEN:{sock},fork", f"TCP:127.0.0.1:{to_port}"], stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 10
    while not sock.exists():
        assert time.monotonic() < deadline and host_side.poll() is None, "socat did not listen"
        time.sleep(0.05)
    inside = subprocess.Popen(
        [
            "nsenter",
            f"--net={daemon.netns}",
            "socat",
            f"TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork",
            f"UNIX-CONNECT:{sock}",
        ],
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while not _listening_in(daemon, port):
            assert time.monotonic() < deadline and inside.poll() is None, "socat did not listen inside"
            time.sleep(0.05)
        yield
    finally:
        for p in (inside, host_side):
            p.terminate()
            p.wait(10)
        sock.unlink(missing_ok=True)


def _listening_in(daemon: Libvirtd, port: int) -> bool:
    ss = subprocess.run(
        ["nsenter", f"--net={daemon.netns}", "ss", "-Hltn", f"sport = :{port}"],
        capture_output=True,
        text=True,
        check=False,
    )
    return bool(ss.stdout.strip())


class Console:
    """A domain's serial console as the operator uses it: `virsh console --force` on a pty. Everything
    the guest prints from the moment of attaching is kept; `send` types on it."""

    def __init__(self, domain: str) -> None:
        self.output = bytearray()
        self._lock = threading.Lock()
        self._fd, tty = os.openpty()  # virsh puts its terminal in raw mode: it needs a real one
        self.proc = subprocess.Popen(
            ["virsh", "-c", LIBVIRT_URI, "console", "--force", domain],
            stdin=tty, stdout=tty, stderr=tty, start_new_session=True,
        )  # fmt: skip
        os.close(tty)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self._fd, 65536)
            except OSError:
                return
            if not chunk:
                return
            with self._lock:
                self.output += chunk

    def text(self, start: int = 0) -> str:
        with self._lock:
            raw = bytes(self.output[start:])
        return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\r", "", raw.decode(errors="replace"))

    def wait_for(self, pattern: str, timeout: float, start: int = 0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if found := re.search(pattern, self.text(start)):
                return found
            time.sleep(1)
        tail = "\n".join(line[:200] for line in self.text().splitlines()[-60:])
        raise AssertionError(f"{pattern!r} not on the console within {timeout:.0f} s; its tail:\n{tail}")

    def send(self, text: str) -> None:
        os.write(self._fd, text.encode())

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._fd)


@contextmanager
def libvirt_dir(prefix: str) -> Iterator[Path]:
    """A directory libvirt's QEMU (user libvirt-qemu) can traverse and read (pytest's are 0700), and
    write: the drives vagrant creates are QEMU's. Removed afterwards."""
    d = IMAGES / f"{prefix}-{uuid.uuid4().hex[:8]}"
    d.mkdir(parents=True, mode=0o755)
    os.chmod(d, 0o777)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def vagrant_env(usb: Path, workdir: Path, pool: str, network_mode: str, **extra: str) -> dict[str, str]:
    """The environment of a test's `vagrant` run: this host's own RIGBASE_ and VAGRANT_ settings left out,
    one TCG node of 1.5 GiB and one CPU, its disks, pool and domain names, and Vagrant's state in
    `workdir`."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("RIGBASE_", "VAGRANT_"))}
    return keep | {
        "RIGBASE_IMAGE": str(usb),
        "RIGBASE_DISK_DIR": str(workdir / "disks"),
        "RIGBASE_NETWORK_MODE": network_mode,
        "RIGBASE_ACCEL": "qemu",
        "RIGBASE_NODE_MEMORY": "1536",
        "RIGBASE_NODE_CPUS": "1",
        "RIGBASE_LIBVIRT_POOL": pool,
        "RIGBASE_DOMAIN_PREFIX": f"{pool}_",
        "VAGRANT_DOTFILE_PATH": str(workdir / "dot-vagrant"),
        "VAGRANT_HOME": str(workdir / "vagrant.d"),
        "VAGRANT_DEFAULT_PROVIDER": "libvirt",
        "VAGRANT_CHECKPOINT_DISABLE": "1",
        **extra,
    }
