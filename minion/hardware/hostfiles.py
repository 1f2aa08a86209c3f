"""Facts from /proc, read under a host root.

Like node-feature-discovery's host paths, every non-sysfs read goes through `host_root` so a test (or a
container with the host mounted at /host) supplies its own /proc. sysfs is not prefixed: it comes through
pyudev, and umockdev redirects that.
"""

from __future__ import annotations

import socket
from pathlib import Path

from minion.hardware.model import Cpu


def host_path(host_root: Path | None, absolute: str) -> Path:
    return (host_root or Path("/")) / absolute.lstrip("/")


def memory_total_bytes(host_root: Path | None) -> int:
    """MemTotal from /proc/meminfo (the kernel writes kB meaning KiB)."""
    for line in host_path(host_root, "/proc/meminfo").read_text().splitlines():
        key, _, value = line.partition(":")
        if key == "MemTotal":
            number, *unit = value.split()
            return int(number) * (1024 if unit and unit[0].lower() == "kb" else 1)
    raise ValueError("/proc/meminfo has no MemTotal line")


def cpu(host_root: Path | None) -> Cpu:
    """Physical cores are distinct (physical id, core id) pairs; threads are processor entries.

    Machines whose /proc/cpuinfo lacks topology (some VMs, some ARM kernels) count each thread as a core,
    which is what such a kernel tells every scheduler anyway."""
    text = host_path(host_root, "/proc/cpuinfo").read_text()
    threads = 0
    cores: set[tuple[str, str]] = set()
    sockets: set[str] = set()
    model: str | None = None
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        if "processor" not in fields:
            continue
        threads += 1
        model = model or fields.get("model name")
        if "physical id" in fields and "core id" in fields:
            cores.add((fields["physical id"], fields["core id"]))
            sockets.add(fields["physical id"])
    return Cpu(physical_cores=len(cores) or threads, threads=threads, sockets=len(sockets) or 1, model=model)


def hostname(host_root: Path | None) -> str:
    path = host_path(host_root, "/proc/sys/kernel/hostname")
    try:
        return path.read_text().strip() or socket.gethostname()
    except OSError:
        return socket.gethostname()
