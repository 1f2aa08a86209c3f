"""NVIDIA GPUs' facts from NVML, when the driver is loaded, through the one NVML adapter
(minion/gpu/health.py: `PynvmlReader` on a node, `RecordedReader` for answers recorded on one).

NVML knows the exact board name and the usable memory (slightly less than the marketing figure), the
PCIe link the GPU and its slot can run at together, and whether the GPU is a module on a baseboard
(SXM, OAM: a non-zero module id) or a PCIe card (0). The hardware rules use these over sysfs and the
catalogue. It is optional: without the driver (the first boot, before the image's driver loads) or
without libnvidia-ml, sysfs and the catalogue answer and the inventory notes why.
"""

from __future__ import annotations

from dataclasses import dataclass

from minion.gpu.driver import sysfs_bus_id
from minion.gpu.health import PROBLEMS, NvmlReader, PynvmlReader


@dataclass(frozen=True)
class NvmlFacts:
    name: str
    memory_total_bytes: int
    pcie_gen: int | None = None  # the generation the GPU and its slot can run at together
    pcie_width: int | None = None  # the link's width now
    pcie_max_width: int | None = None
    sxm: bool | None = None  # a module on a baseboard (None: NVML could not say)


def query(
    pci_addresses: list[str], reader: NvmlReader | None = None
) -> tuple[dict[str, NvmlFacts], str | None]:
    """({pci_address: facts}, None) or ({}, why NVML could not be used); `reader`: PynvmlReader()."""
    answers = (reader or PynvmlReader(xids=None)).read()
    if answers.error_code is not None:
        why = PROBLEMS.get(answers.error_code) or answers.error
        return {}, f"NVML unavailable: {why}; GPU facts come from sysfs and the catalogue"
    wanted = set(pci_addresses)
    facts: dict[str, NvmlFacts] = {}
    problems: list[str] = []
    for gpu in answers.gpus:
        address = sysfs_bus_id(gpu.pci_bus_id) if gpu.pci_bus_id else None
        if gpu.error is not None or address is None or gpu.name is None or gpu.memory_total is None:
            problems.append(
                f"GPU {gpu.index}{f' at {address}' if address else ''}: {gpu.error or 'no answer'}"
            )
            continue
        if address in wanted:
            facts[address] = NvmlFacts(
                name=gpu.name,
                memory_total_bytes=gpu.memory_total,
                pcie_gen=gpu.pcie_max_gen,
                pcie_width=gpu.pcie_width,
                pcie_max_width=gpu.pcie_max_width,
                sxm=None if gpu.module_id is None else gpu.module_id > 0,
            )
    return facts, ("NVML could not read " + "; ".join(problems)) if problems else None
