"""`minion run`'s GPU health (desired["gpu_health"]): each beat that asks for it, one NVML read assessed
by minion/gpu/health.py, reported as a GpuHealthReport."""

from __future__ import annotations

from typing import Any

from contracts.gpu_health import GpuHealthReport
from contracts.heartbeat_keys import HeartbeatKey
from minion import desired
from minion.gpu.health import NvmlReader, PynvmlReader, assess


def handler(reader: NvmlReader) -> Any:
    def handle(value: Any) -> dict[str, Any]:
        report = assess(reader.read()) if value else GpuHealthReport()
        return report.model_dump(mode="json")

    return handle


def setup(ctx: Any) -> None:
    """Register the `gpu_health` handler for this `minion run` (ctx: minion.join.run.RunContext)."""
    desired.register(HeartbeatKey.GPU_HEALTH, handler(PynvmlReader()))
