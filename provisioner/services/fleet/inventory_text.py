"""A minion's inventory report as one line of text (GPUs, cores, memory, NVMe drives): what
`provision node pending` shows for a machine nobody has added yet."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

TB = 1e12  # drive sizes are sold in decimal terabytes
GIB = 2**30


def one_line(inv: Mapping[str, Any]) -> str:
    """One line from the minion's inventory report: GPUs, cores, memory, NVMe drives."""
    parts = []
    gpus = [g for g in inv.get("gpus") or [] if isinstance(g, dict)]
    if gpus:
        models = sorted({str(g.get("model") or g.get("name") or "?") for g in gpus})
        parts.append(f"{len(gpus)}x {'/'.join(models)}")
    cpu = inv.get("cpu")
    if not isinstance(cpu, dict):
        cpu = {}
    if cpu.get("physical_cores"):
        parts.append(f"{cpu['physical_cores']} cores")
    if inv.get("memory_total_bytes"):
        parts.append(f"{int(inv['memory_total_bytes']) / GIB:.0f} GiB RAM")
    nvme = [d for d in inv.get("drives") or [] if isinstance(d, dict) and d.get("kind") == "nvme"]
    if nvme:
        parts.append(f"{len(nvme)} NVMe {sum(int(d.get('size_bytes') or 0) for d in nvme) / TB:.1f} TB")
    return ", ".join(parts) or "-"
