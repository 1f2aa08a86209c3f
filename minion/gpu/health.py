"""The node's GPUs as NVML sees them, and what each is fit for (contracts/gpu_health.py).

Two halves, so the rules run the same against a real driver and against recorded answers:
- a reader asks NVML (nvidia-ml-py, NVIDIA's own bindings) everything once and returns plain answers
  (`NvmlAnswers`): `PynvmlReader` on a node, `RecordedReader` for a recording `minion gpu health
  --record FILE` made on a real GPU (tests replay those);
- `assess` turns answers into the report: a lost GPU is not offered, uncorrectable ECC errors or a fatal
  Xid fail it (its node leaves placement), a process outside rigbase's containers makes it busy.

Xid events arrive asynchronously: `XidWatch` waits on NVML's event set in a thread of its own and
remembers the last fatal one per GPU until the driver is reloaded (the node reboots)."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

from contracts.gpu_health import FATAL_XIDS, GpuHealth, GpuHealthReport, GpuState

log = logging.getLogger(__name__)

PROC: Final = Path("/proc")
# NVML's error codes (nvml.h) that say something about the node rather than one GPU
DRIVER_NOT_LOADED: Final = 9
LIBRARY_NOT_FOUND: Final = 12
GPU_IS_LOST: Final = 15
LIB_RM_VERSION_MISMATCH: Final = 18
PROBLEMS: Final = {
    DRIVER_NOT_LOADED: "the NVIDIA driver is installed but its kernel module is not loaded: "
    "boot the image built with --with-nvidia, or `modprobe nvidia`",
    LIB_RM_VERSION_MISMATCH: "the NVIDIA kernel module and its user-space libraries are different versions: "
    "reboot so the image's module and libraries load together",
    LIBRARY_NOT_FOUND: "no NVIDIA driver on this node (libnvidia-ml is not installed)",
}


@dataclass
class GpuAnswers:
    """What NVML answered for one GPU; `error` when it could not be opened (NVML's code and text)."""

    index: int
    uuid: str | None = None
    name: str | None = None
    pci_bus_id: str | None = None
    memory_total: int | None = None
    memory_used: int | None = None
    pcie_gen: int | None = None  # the link now (an idle GPU trains down)
    pcie_width: int | None = None
    pcie_max_gen: int | None = None  # the most the GPU and its slot can run at together
    pcie_max_width: int | None = None
    module_id: int | None = None  # its module on a baseboard (SXM, OAM); 0 on a PCIe card
    mig: bool | None = None
    ecc_uncorrected: int | None = None
    ecc_corrected: int | None = None
    util_pct: float | None = None
    power_mw: int | None = None
    temp_c: float | None = None
    pids: list[int] = field(default_factory=list)
    error_code: int | None = None
    error: str | None = None


@dataclass
class NvmlAnswers:
    """One read of NVML: the driver, every GPU, the fatal Xids seen; or why NVML could not start."""

    driver_version: str | None = None
    gpus: list[GpuAnswers] = field(default_factory=list)
    xids: dict[int, int] = field(default_factory=dict)  # GPU index → its last fatal Xid
    error_code: int | None = None
    error: str | None = None

    def dump(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True) + "\n"

    @classmethod
    def load(cls, text: str) -> NvmlAnswers:
        data = json.loads(text)
        gpus = [GpuAnswers(**g) for g in data.pop("gpus", [])]
        xids = {int(k): int(v) for k, v in data.pop("xids", {}).items()}
        return cls(**data, gpus=gpus, xids=xids)


class NvmlReader(Protocol):
    def read(self) -> NvmlAnswers: ...


@dataclass(frozen=True)
class RecordedReader:
    """Answers recorded on a real GPU (`minion gpu health --record FILE`), replayed."""

    path: Path

    def read(self) -> NvmlAnswers:
        return NvmlAnswers.load(self.path.read_text())


# -- the rules -------------------------------------------------------------------------------------------


def in_rigbase_container(pid: int, proc: Path = PROC) -> bool:
    """Whether `pid` runs in one of rigbase's podman containers (a libpod cgroup): a job's worker or a
    device's inference container. Anything else holding a GPU is outside rigbase."""
    try:
        return "libpod" in (proc / str(pid) / "cgroup").read_text()
    except OSError:
        return True  # gone since NVML listed it: nothing holds the GPU any more


def _state(answers: GpuAnswers, xid: int | None, outside: list[int]) -> tuple[GpuState, str | None]:
    if answers.error_code is not None:
        if answers.error_code == GPU_IS_LOST:
            return GpuState.LOST, f"it has fallen off the bus (NVML: {answers.error})"
        return GpuState.LOST, f"NVML cannot open it (NVML: {answers.error})"
    failures = []
    if answers.ecc_uncorrected:
        failures.append(f"uncorrectable ECC errors ({answers.ecc_uncorrected}) since the driver loaded")
    if xid is not None:
        failures.append(f"Xid {xid} ({FATAL_XIDS.get(xid, 'fatal')})")
    if failures:
        return GpuState.FAILED, "; ".join(failures)
    if outside:
        pids = ", ".join(str(p) for p in outside[:8])
        return GpuState.BUSY, f"held by {len(outside)} process(es) outside rigbase's containers (pid {pids})"
    return GpuState.OK, None


def assess(answers: NvmlAnswers, ours: Callable[[int], bool] = in_rigbase_container) -> GpuHealthReport:
    """The report of one NVML read, by the rules of contracts/gpu_health.py."""
    if answers.error_code is not None:
        problem = PROBLEMS.get(answers.error_code, f"NVML could not start ({answers.error})")
        return GpuHealthReport(driver_version=answers.driver_version, problem=problem)
    gpus = []
    for g in answers.gpus:
        outside = [p for p in g.pids if not ours(p)]
        state, reason = _state(g, answers.xids.get(g.index), outside)
        gpus.append(
            GpuHealth(
                index=g.index,
                uuid=g.uuid,
                name=g.name,
                pci_bus_id=g.pci_bus_id,
                memory_bytes=g.memory_total,
                pcie_gen=g.pcie_gen,
                pcie_width=g.pcie_width,
                mig=g.mig,
                ecc_uncorrected=g.ecc_uncorrected,
                ecc_corrected=g.ecc_corrected,
                xid=answers.xids.get(g.index),
                util_pct=g.util_pct,
                memory_used_bytes=g.memory_used,
                power_w=g.power_mw / 1000.0 if g.power_mw is not None else None,
                temp_c=g.temp_c,
                outside_pids=outside[:64],
                state=state,
                reason=reason,
            )  # fmt: skip
        )
    return GpuHealthReport(driver_version=answers.driver_version, gpus=gpus)


# -- NVML itself -----------------------------------------------------------------------------------------


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _optional(fn: Callable[[], Any]) -> Any:
    """An NVML query a GPU may not support (ECC on a consumer board, MIG before Ampere): None then."""
    import pynvml

    try:
        return fn()
    except pynvml.NVMLError:
        return None


def _one_gpu(nv: Any, index: int) -> GpuAnswers:
    try:
        h = nv.nvmlDeviceGetHandleByIndex(index)
        memory = nv.nvmlDeviceGetMemoryInfo(h)
        answers = GpuAnswers(
            index=index,
            uuid=_text(nv.nvmlDeviceGetUUID(h)),
            name=_text(nv.nvmlDeviceGetName(h)),
            pci_bus_id=_text(nv.nvmlDeviceGetPciInfo(h).busId),
            memory_total=int(memory.total),
            memory_used=int(memory.used),
        )
    except nv.NVMLError as exc:
        return GpuAnswers(index=index, error_code=int(exc.value), error=str(exc))
    vol, unc, cor = (
        nv.NVML_VOLATILE_ECC,
        nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
        nv.NVML_MEMORY_ERROR_TYPE_CORRECTED,
    )
    mig = _optional(lambda: nv.nvmlDeviceGetMigMode(h))
    answers.pcie_gen = _optional(lambda: int(nv.nvmlDeviceGetCurrPcieLinkGeneration(h)))
    answers.pcie_width = _optional(lambda: int(nv.nvmlDeviceGetCurrPcieLinkWidth(h)))
    answers.pcie_max_gen = _optional(lambda: int(nv.nvmlDeviceGetMaxPcieLinkGeneration(h)))
    answers.pcie_max_width = _optional(lambda: int(nv.nvmlDeviceGetMaxPcieLinkWidth(h)))
    answers.module_id = _optional(lambda: int(nv.nvmlDeviceGetModuleId(h)))
    answers.mig = bool(mig[0]) if mig is not None else None
    answers.ecc_uncorrected = _optional(lambda: int(nv.nvmlDeviceGetTotalEccErrors(h, unc, vol)))
    answers.ecc_corrected = _optional(lambda: int(nv.nvmlDeviceGetTotalEccErrors(h, cor, vol)))
    answers.util_pct = _optional(lambda: float(nv.nvmlDeviceGetUtilizationRates(h).gpu))
    answers.power_mw = _optional(lambda: int(nv.nvmlDeviceGetPowerUsage(h)))
    answers.temp_c = _optional(lambda: float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)))
    holders = (_optional(lambda: nv.nvmlDeviceGetComputeRunningProcesses(h)) or []) + (
        _optional(lambda: nv.nvmlDeviceGetGraphicsRunningProcesses(h)) or []
    )
    answers.pids = sorted({int(p.pid) for p in holders})
    return answers


class XidWatch:
    """The last fatal Xid per GPU index, from NVML's event set, waited on in a daemon thread."""

    WAIT_MS: Final = 5000

    def __init__(self) -> None:
        self.seen: dict[int, int] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="nvml-xid", daemon=True)
            self._thread.start()

    def snapshot(self) -> dict[int, int]:
        with self._lock:
            return dict(self.seen)

    def _run(self) -> None:
        import pynvml as nv

        try:
            nv.nvmlInit()
            events = nv.nvmlEventSetCreate()
            for index in range(nv.nvmlDeviceGetCount()):
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, events)
        except nv.NVMLError as exc:
            log.info("no Xid events from NVML (%s)", exc)
            return
        while True:
            try:
                event = nv.nvmlEventSetWait_v2(events, self.WAIT_MS)
                index, xid = int(nv.nvmlDeviceGetIndex(event.device)), int(event.eventData)
            except nv.NVMLError_Timeout:
                continue
            except nv.NVMLError as exc:
                log.warning("NVML's Xid events stopped (%s)", exc)
                return
            if xid in FATAL_XIDS:
                log.error("GPU %d: Xid %d (%s)", index, xid, FATAL_XIDS[xid])
                with self._lock:
                    self.seen[index] = xid


@dataclass
class PynvmlReader:
    """NVML on this node, asked everything once per read; its Xid watch started on the first."""

    xids: XidWatch | None = field(default_factory=XidWatch)  # None: one read, no Xid thread (inventory)

    def read(self) -> NvmlAnswers:
        try:
            import pynvml as nv
        except ImportError as exc:  # nvidia-ml-py is a dependency; a broken install still must not crash
            return NvmlAnswers(error_code=LIBRARY_NOT_FOUND, error=str(exc))
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            return NvmlAnswers(error_code=int(exc.value), error=str(exc))
        try:
            if self.xids is not None:
                self.xids.start()
            version = _optional(lambda: _text(nv.nvmlSystemGetDriverVersion()))
            count = int(nv.nvmlDeviceGetCount())
            gpus = [_one_gpu(nv, i) for i in range(count)]
            xids = self.xids.snapshot() if self.xids is not None else {}
            return NvmlAnswers(driver_version=version, gpus=gpus, xids=xids)
        except nv.NVMLError as exc:
            return NvmlAnswers(error_code=int(exc.value), error=str(exc))
        finally:
            nv.nvmlShutdown()
