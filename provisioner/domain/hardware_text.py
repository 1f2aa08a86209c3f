"""A minion's inventory and requirements reports as one line of text each: what `provision node pending`
and `node show` print and the console shows (the reports themselves are under `-o yaml`)."""

from __future__ import annotations

from collections import Counter
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


def failed_rules(requirements: Mapping[str, Any]) -> list[str]:
    """The hardware rules a minion's requirements report says it fails (the join refuses those)."""
    rules = requirements.get("rules") or []
    return [str(r.get("rule")) for r in rules if isinstance(r, dict) and not r.get("ok", True)]


def requirements_line(requirements: Mapping[str, Any]) -> str:
    """`pass`, `fail: nvme-drives, memory-vs-vram` or `unknown` (no report yet); `provision node adopt`
    reads `pass` as is."""
    failing = failed_rules(requirements)
    ok = requirements.get("ok")
    if ok is None and not failing:
        return "unknown"
    if failing or ok is False:
        return "fail: " + (", ".join(failing) or "no rule named")
    return "pass"


def gpu_health_line(report: Mapping[str, Any]) -> str:
    """A node's GPU health report (contracts.gpu_health.GpuHealthReport) as one line: the driver, the
    GPUs by state, the first one that is not ok with its reason, and why the node has no CDI spec; or
    NVML's problem."""
    if report.get("problem"):
        return f"{report['problem']}"
    gpus = report.get("gpus") or []
    if not gpus:
        return "no GPU reported"
    states = Counter(str(g.get("state")) for g in gpus)
    line = f"driver {report.get('driver_version') or '?'}: " + ", ".join(
        f"{n} {state}" for state, n in sorted(states.items(), key=lambda kv: kv[0] != "ok")
    )
    bad = next((g for g in gpus if g.get("state") != "ok"), None)
    line += f"; GPU {bad.get('index')} {bad.get('state')}: {bad.get('reason')}" if bad else ""
    return line + (f"; none offered: {report['cdi_problem']}" if report.get("cdi_problem") else "")
