"""`minion run`'s GPUs: the node's CDI spec kept in step with its driver (minion/gpu/keeper.py), which
the jobs and the device agents give containers GPUs from; and the GPU health (desired["gpu_health"]):
each beat that asks for it, one NVML read assessed by minion/gpu/health.py, with why the node has no
CDI spec, reported as a GpuHealthReport."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from contracts.gpu_health import GpuHealthReport
from contracts.heartbeat_keys import HeartbeatKey
from minion import desired
from minion.gpu import cdi
from minion.gpu.health import NvmlReader, PynvmlReader, assess
from minion.gpu.keeper import CdiKeeper
from minion.settings import ContainerSettings

log = logging.getLogger(__name__)


def handler(reader: NvmlReader, cdi_problem: Callable[[], str | None] = lambda: None) -> Any:
    def handle(value: Any) -> dict[str, Any]:
        if not value:
            return GpuHealthReport().model_dump(mode="json")
        report = assess(reader.read())
        if report.problem is None:  # a driver NVML cannot start has one line already: that one
            report = report.model_copy(update={"cdi_problem": cdi_problem()})
        return report.model_dump(mode="json")

    return handle


def keeper(settings: ContainerSettings) -> CdiKeeper | None:
    """The keeper of the node's NVIDIA spec, refreshed once; None when jobs use GPUs of another kind."""
    if settings.gpu_kind != cdi.KIND:
        return None
    kept = CdiKeeper(settings.cdi_spec_dirs[-1], settings.cdi_spec_dirs)
    if note := kept.refresh():
        log.info("GPUs: %s", note)
    return kept


def setup(ctx: Any) -> None:
    """Keep the CDI spec and register the `gpu_health` handler (ctx: minion.join.run.RunContext)."""
    ctx.gpu_spec = keeper(getattr(ctx, "jobs", None) or ContainerSettings())
    spec = ctx.gpu_spec
    note = (lambda: spec.refresh()) if spec is not None else (lambda: None)
    desired.register(HeartbeatKey.GPU_HEALTH, handler(PynvmlReader(), note))
