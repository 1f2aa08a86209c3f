"""What a running worker's container uses, sampled about every USAGE_SAMPLE_S from the kernel's own
counters (contracts/jobs.py WorkerUsage), for the heartbeat's report and `provision job usage`.

- CPU and memory from the container's cgroup, found through its first process (/proc/PID/cgroup): the
  unified hierarchy's `cpu.stat` and `memory.current` (cgroup v2, what a rigbase node runs), or the v1
  controllers' `cpuacct.usage` and `memory.usage_in_bytes` on a host that still mounts them;
- network from /proc/PID/net/dev, which is the container's own network namespace: every interface but
  loopback;
- disk from the container's writable layer (the bytes it wrote, what disk_gb bounds);
- GPUs from NVML (nvidia-ml-py) for the worker's GPU indices, where the driver is loaded.

A counter the host does not have reads as 0 rather than failing the sample: usage is for people to look
at and never decides anything."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from contracts.jobs import USAGE_PER_REPORT, GpuUsage, WorkerUsage

PROC: Final = Path("/proc")
CGROUP_ROOT: Final = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class Counters:
    at: float  # time.time()
    cpu_ns: int  # CPU time since the container started
    memory_bytes: int
    net_rx_bytes: int
    net_tx_bytes: int


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def cgroup_dirs(pid: int, proc: Path = PROC, root: Path = CGROUP_ROOT) -> dict[str, Path]:
    """Controller → the directory of `pid`'s cgroup in it ("" for the unified hierarchy)."""
    out: dict[str, Path] = {}
    try:
        lines = (proc / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        _, controllers, path = line.split(":", 2)
        relative = path.lstrip("/")
        if not controllers:
            unified = root / "unified" if (root / "unified").is_dir() else root
            out[""] = unified / relative
        for controller in controllers.split(","):
            if controller and not controller.startswith("name="):
                out[controller] = root / controllers / relative
    return out


def _cpu_ns(dirs: dict[str, Path]) -> int:
    v1 = dirs.get("cpuacct")
    if v1 is not None and (used := _read_int(v1 / "cpuacct.usage")) is not None:
        return used
    unified = dirs.get("")
    if unified is not None:
        try:
            for line in (unified / "cpu.stat").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) * 1000
        except (OSError, ValueError):
            pass
    return 0


def _memory(dirs: dict[str, Path]) -> int:
    v1 = dirs.get("memory")
    if v1 is not None and (used := _read_int(v1 / "memory.usage_in_bytes")) is not None:
        return used
    unified = dirs.get("")
    return (_read_int(unified / "memory.current") if unified is not None else None) or 0


def net_bytes(pid: int, proc: Path = PROC) -> tuple[int, int]:
    """Received and sent bytes of every interface but loopback in `pid`'s network namespace."""
    rx = tx = 0
    try:
        lines = (proc / str(pid) / "net" / "dev").read_text().splitlines()[2:]
    except OSError:
        return 0, 0
    for line in lines:
        name, _, fields = line.partition(":")
        values = fields.split()
        if name.strip() == "lo" or len(values) < 9:
            continue
        rx += int(values[0])
        tx += int(values[8])
    return rx, tx


def counters(pid: int, proc: Path = PROC, root: Path = CGROUP_ROOT) -> Counters:
    dirs = cgroup_dirs(pid, proc, root)
    rx, tx = net_bytes(pid, proc)
    return Counters(time.time(), _cpu_ns(dirs), _memory(dirs), rx, tx)


def gpu_usage(indices: Sequence[int]) -> list[GpuUsage]:
    """NVML's view of these GPUs now; nothing without the driver or the library."""
    if not indices:
        return []
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    out: list[GpuUsage] = []
    try:
        for index in indices:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            out.append(
                GpuUsage(
                    index=index,
                    util_pct=float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu),
                    memory_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(handle).used),
                    power_w=pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
                    temp_c=float(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)),
                )
            )
    except pynvml.NVMLError:
        return out
    finally:
        pynvml.nvmlShutdown()
    return out


@dataclass
class UsageSampler:
    """One worker's samples: the last USAGE_PER_REPORT of them, for its report."""

    pid: int
    disk: Callable[[], int]  # bytes in its writable layer now
    gpus: Callable[[], list[GpuUsage]]
    proc: Path = PROC
    root: Path = CGROUP_ROOT

    def __post_init__(self) -> None:
        self.previous = counters(self.pid, self.proc, self.root)
        self.samples: deque[WorkerUsage] = deque(maxlen=USAGE_PER_REPORT)

    def sample(self) -> WorkerUsage:
        now = counters(self.pid, self.proc, self.root)
        wall = max(now.at - self.previous.at, 1e-3)
        cores = max(0, now.cpu_ns - self.previous.cpu_ns) / 1e9 / wall
        self.previous = now
        usage = WorkerUsage(
            at=round(now.at, 3),
            cpu_cores=round(min(cores, 4096.0), 3),
            memory_bytes=now.memory_bytes,
            disk_bytes=self.disk(),
            net_rx_bytes=now.net_rx_bytes,
            net_tx_bytes=now.net_tx_bytes,
            gpus=self.gpus(),
        )
        self.samples.append(usage)
        return usage

    def latest(self, count: int = USAGE_PER_REPORT) -> list[WorkerUsage]:
        return list(self.samples)[-count:] if count > 0 else []
