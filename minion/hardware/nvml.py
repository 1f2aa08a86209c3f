"""Name and memory of NVIDIA GPUs from NVML, when the driver is loaded.

NVML knows the exact board name and the usable memory (slightly less than the marketing figure), which
the catalogue can only approximate. It is optional: without the driver (the first boot, before the
image's driver loads) or without libnvidia-ml, the catalogue answers and the inventory notes why.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NvmlFacts:
    name: str
    memory_total_bytes: int


def query(pci_addresses: list[str]) -> tuple[dict[str, NvmlFacts], str | None]:
    """({pci_address: facts}, None) or ({}, reason NVML could not be used)."""
    try:
        import pynvml
    except ImportError as exc:  # nvidia-ml-py is a dependency; a broken install still must not crash
        return {}, f"NVML bindings not importable ({exc})"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return {}, f"NVML unavailable ({exc}); GPU facts come from the catalogue"
    facts: dict[str, NvmlFacts] = {}
    problems: list[str] = []
    try:
        for address in pci_addresses:
            try:
                handle = pynvml.nvmlDeviceGetHandleByPciBusId(address)
                name = pynvml.nvmlDeviceGetName(handle)
                memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            except pynvml.NVMLError as exc:
                problems.append(f"{address}: {exc}")
                continue
            facts[address] = NvmlFacts(
                name=name.decode() if isinstance(name, bytes) else str(name),
                memory_total_bytes=int(memory.total),
            )
    finally:
        pynvml.nvmlShutdown()
    return facts, ("NVML could not read " + "; ".join(problems)) if problems else None
