"""The hardware requirements of docs/product-rules.md ("Hardware requirements") as a rule table.

Each rule is data: an id, when it applies (always, with public jobs, per storage mode) and a measure
that turns an Inventory into (ok, required, found, detail). `check()` runs the applicable rules in table
order. Figures carry units: storage is decimal TB as drives are sold, memory binary GiB.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from contracts.regional import StorageMode
from minion.hardware.model import FormFactor, Gpu, Inventory
from minion.hardware.units import TB, gib, link_speed, plural, storage


class Applies(StrEnum):
    ALWAYS = "always"
    PUBLIC_JOBS = "with --public-jobs"
    LOCAL_STORAGE = "with --storage-mode local"
    CENTRAL_STORAGE = "with --storage-mode central"

    def holds(self, storage_mode: StorageMode | None, public_jobs: bool) -> bool:
        return {
            Applies.ALWAYS: True,
            Applies.PUBLIC_JOBS: public_jobs,
            Applies.LOCAL_STORAGE: storage_mode is StorageMode.LOCAL,
            Applies.CENTRAL_STORAGE: storage_mode is StorageMode.CENTRAL,
        }[self]


@dataclass(frozen=True)
class Measurement:
    ok: bool
    required: str
    found: str
    detail: str


@dataclass(frozen=True)
class RequirementRule:
    id: str
    applies: Applies
    summary: str  # the requirement in one line, for docs and `minion check` tables
    measure: Callable[[Inventory], Measurement]


@dataclass(frozen=True)
class RuleResult:
    rule: str
    ok: bool
    required: str
    found: str
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "ok": self.ok,
            "required": self.required,
            "found": self.found,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class RequirementReport:
    ok: bool
    rules: list[RuleResult]
    storage_mode: StorageMode | None
    public_jobs: bool

    @property
    def failed(self) -> list[RuleResult]:
        return [r for r in self.rules if not r.ok]

    @property
    def scope(self) -> str:
        """The region kind this report was made for, e.g. 'storage mode local, public jobs'."""
        mode = f"storage mode {self.storage_mode.value}" if self.storage_mode else "no storage mode"
        return f"{mode}, {'public jobs' if self.public_jobs else 'private jobs only'}"

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "rules": [r.to_json() for r in self.rules]}


# --- thresholds (numbers of the requirement text) ------------------------------------------------------
MIN_NVME_DRIVES = 2
NVME_TB_PER_GPU_PAIR = 1
MIN_LANES_PER_GPU = 8
CORES_PER_GPU_BY_GEN = {3: 2, 4: 4}  # PCIe 3.0 (and older) -> 2, PCIe 4.0 and newer -> 4
MIN_SATA_DRIVES = 3
MIN_SATA_BYTES = 2 * TB
MIN_HDD_RPM = 7200
MIN_NIC_MBPS = 10_000
RAM_PER_VRAM = 2
# MemTotal is what the kernel can hand out: installed DIMMs minus firmware reservations and the kernel's
# own page tables (about 1.6 % for struct page alone). A server with exactly 2x VRAM installed reads a few
# percent short, so the memory rule accepts MemTotal down to 96 % of its figure and says so.
MEMTOTAL_ALLOWANCE = 0.96
# What a rule's `required` says when an input it needs is unknown (a GPU's memory without catalogue or
# NVML), rather than a figure computed from a missing value.
UNKNOWN_REQUIREMENT = "unknown"


def _gpu_summary(gpus: list[Gpu]) -> str:
    return ", ".join(f"{n} x {model}" for model, n in Counter(g.model for g in gpus).most_common())


def _gpu_single_model(inv: Inventory) -> Measurement:
    models = Counter(g.model for g in inv.gpus)
    if not models:
        return Measurement(
            True, "one GPU model", "no GPUs", "No GPUs are installed, so there are no models to mix."
        )
    if len(models) == 1:
        return Measurement(True, "one GPU model", _gpu_summary(inv.gpus), "All GPUs are the same model.")
    return Measurement(
        False,
        "one GPU model",
        _gpu_summary(inv.gpus),
        f"{len(models)} GPU models are installed; remove or replace GPUs until all are the same model.",
    )


def _nvme_count(inv: Inventory) -> Measurement:
    n = len(inv.nvme_drives)
    required = f">= {MIN_NVME_DRIVES} NVMe drives"
    if n >= MIN_NVME_DRIVES:
        return Measurement(True, required, plural(n, "NVMe drive"), "Enough NVMe drives.")
    return Measurement(
        False,
        required,
        plural(n, "NVMe drive"),
        f"Install {MIN_NVME_DRIVES - n} more NVMe {'drive' if MIN_NVME_DRIVES - n == 1 else 'drives'}.",
    )


def required_nvme_bytes(gpu_count: int) -> int:
    """1 TB per 2 GPUs, rounded up; a machine without GPUs still needs the 1 TB of a 1-GPU machine
    (the smallest figure the requirement names) for job scratch space."""
    return max(1, math.ceil(gpu_count / 2)) * NVME_TB_PER_GPU_PAIR * TB


def _nvme_capacity(inv: Inventory) -> Measurement:
    need = required_nvme_bytes(len(inv.gpus))
    have = sum(d.size_bytes for d in inv.nvme_drives)
    required = f">= {storage(need)} NVMe total (1 TB per 2 GPUs, {plural(len(inv.gpus), 'GPU')})"
    found = f"{storage(have)} on {plural(len(inv.nvme_drives), 'NVMe drive')}"
    if have >= need:
        return Measurement(True, required, found, "Enough NVMe capacity (decimal TB, as drives are sold).")
    return Measurement(
        False,
        required,
        found,
        f"Add at least {storage(need - have)} of NVMe capacity (decimal, as drives are sold).",
    )


def _tpm2(inv: Inventory) -> Measurement:
    tpm = inv.tpm
    if not tpm.present:
        return Measurement(
            False,
            "TPM 2.0",
            "no TPM",
            "No TPM found; enable the TPM 2.0 (or fTPM / Intel PTT) in the firmware "
            "setup, clear it, and reboot.",
        )
    if tpm.major_version == 2:
        return Measurement(True, "TPM 2.0", f"TPM 2.0 ({tpm.device})", "A TPM 2.0 is present.")
    if tpm.major_version is None:
        return Measurement(
            False,
            "TPM 2.0",
            f"TPM of unknown version ({tpm.device})",
            "The TPM does not report its version; update the kernel or switch the firmware TPM to 2.0 mode.",
        )
    return Measurement(
        False,
        "TPM 2.0",
        f"TPM {tpm.major_version}.x ({tpm.device})",
        f"This TPM is version {tpm.major_version}.x; switch the firmware TPM to 2.0 mode "
        "or install a TPM 2.0 module.",
    )


def _memory_vs_vram(inv: Inventory) -> Measurement:
    unknown = [g for g in inv.gpus if g.vram_bytes is None]
    vram = sum(g.vram_bytes or 0 for g in inv.gpus)
    need = RAM_PER_VRAM * vram
    have = inv.memory_total_bytes
    required = f">= {gib(need)} RAM ({RAM_PER_VRAM} x {gib(vram)} VRAM)"
    found = f"{gib(have)} RAM"
    if unknown:
        # A GPU of unknown memory would otherwise add 0 GiB to the figure; the figure is not known, and
        # the column says so in words (docs/hardware.md: `required` is always a string).
        return Measurement(
            False,
            f"{UNKNOWN_REQUIREMENT} ({RAM_PER_VRAM} x VRAM)",
            found,
            f"The memory of {plural(len(unknown), 'GPU')} is unknown; load the GPU driver "
            "so NVML can report it.",
        )
    if have >= need:
        return Measurement(True, required, found, "Enough system memory for the GPU memory.")
    if have >= need * MEMTOTAL_ALLOWANCE:
        return Measurement(
            True,
            required,
            found,
            "Enough system memory: the kernel reports a few percent less than installed.",
        )
    return Measurement(
        False,
        required,
        found,
        f"Add at least {gib(math.ceil(need - have))} of RAM (twice the total GPU memory is required).",
    )


def _pcie_lanes(inv: Inventory) -> Measurement:
    required = f">= x{MIN_LANES_PER_GPU} link per PCIe GPU"
    pcie = [g for g in inv.gpus if g.form_factor is not FormFactor.SXM]
    if not pcie:
        what = "no GPUs" if not inv.gpus else f"{plural(len(inv.gpus), 'SXM GPU')}"
        return Measurement(
            True, required, what, "No PCIe GPUs; SXM GPUs talk over NVLink, so the lane rule does not apply."
        )
    unreadable = [g for g in pcie if g.link.current_width is None]
    narrow = [
        g for g in pcie if g.link.current_width is not None and g.link.current_width < MIN_LANES_PER_GPU
    ]
    widths = Counter(f"x{g.link.current_width}" if g.link.current_width else "x?" for g in pcie)
    found = ", ".join(f"{n} at {w}" for w, n in sorted(widths.items()))
    if unreadable:
        return Measurement(
            False,
            required,
            found,
            f"The link width of {plural(len(unreadable), 'GPU')} is unreadable in sysfs; "
            "check the slot and the kernel.",
        )
    if narrow:
        where = ", ".join(g.pci_address for g in narrow)
        return Measurement(
            False,
            required,
            found,
            f"Move {plural(len(narrow), 'GPU')} ({where}) to x{MIN_LANES_PER_GPU} or wider "
            "slots (risers and x4 slots starve the GPU).",
        )
    return Measurement(True, required, found, "Every PCIe GPU has enough lanes.")


def cores_needed(gpu: Gpu) -> int:
    """2 cores per PCIe 3.0 GPU, 4 per PCIe 4.0 or newer. An unknown generation counts as 4.0+,
    the stricter figure, so an unreadable link never lets an under-provisioned node through."""
    generation = gpu.pcie_gen
    if generation is not None and generation <= 3:
        return CORES_PER_GPU_BY_GEN[3]
    return CORES_PER_GPU_BY_GEN[4]


def _cpu_cores_per_gpu(inv: Inventory) -> Measurement:
    need = sum(cores_needed(g) for g in inv.gpus)
    generations = Counter(f"PCIe {g.pcie_gen}.0" if g.pcie_gen else "PCIe ?" for g in inv.gpus)
    basis = ", ".join(f"{n} x {gen}" for gen, n in sorted(generations.items())) or "no GPUs"
    required = f">= {need} physical cores ({basis})"
    found = f"{inv.cpu.physical_cores} cores / {inv.cpu.threads} threads"
    if inv.cpu.physical_cores >= need:
        return Measurement(True, required, found, "Enough CPU cores for the GPUs.")
    return Measurement(
        False,
        required,
        found,
        f"{need - inv.cpu.physical_cores} more physical cores are needed (2 per PCIe 3.0 "
        "GPU, 4 per PCIe 4.0+ GPU; hyper-threads do not count).",
    )


def _qualifies_for_local_storage(size_bytes: int, rotational: bool | None, rpm: int | None) -> bool:
    if size_bytes < MIN_SATA_BYTES:
        return False
    return not (rotational and rpm is not None and rpm < MIN_HDD_RPM)


def _sata_drives(inv: Inventory) -> Measurement:
    good = [d for d in inv.sata_drives if _qualifies_for_local_storage(d.size_bytes, d.rotational, d.rpm)]
    required = (
        f">= {MIN_SATA_DRIVES} SATA/SAS drives of >= {storage(MIN_SATA_BYTES)} (SSD or >= {MIN_HDD_RPM} rpm)"
    )
    sizes = ", ".join(storage(d.size_bytes) for d in inv.sata_drives) or "none"
    found = f"{len(good)} qualifying of {plural(len(inv.sata_drives), 'SATA/SAS drive')} ({sizes})"
    if len(good) >= MIN_SATA_DRIVES:
        return Measurement(True, required, found, "Enough local storage drives.")
    return Measurement(
        False,
        required,
        found,
        f"Install {MIN_SATA_DRIVES - len(good)} more SATA drives of 2 TB or more, or "
        "put this node in a central-storage region.",
    )


def _network_10gbe(inv: Inventory) -> Measurement:
    required = f"a NIC at >= {link_speed(MIN_NIC_MBPS)}"
    known = [n for n in inv.nics if n.speed_mbps]
    if not inv.nics:
        return Measurement(
            False,
            required,
            "no physical NICs",
            "No physical Ethernet interface found; install a 10 Gb/s (100 Gb/s preferred) NIC.",
        )
    best = max(known, key=lambda n: n.speed_mbps or 0, default=None)
    found = f"fastest {best.name} at {link_speed(best.speed_mbps)}" if best else "no NIC with link"
    if best and (best.speed_mbps or 0) >= MIN_NIC_MBPS:
        return Measurement(True, required, found, "The network is fast enough for central storage.")
    return Measurement(
        False,
        required,
        found,
        "Connect a 10 Gb/s (100 Gb/s preferred) Ethernet link; a NIC without link reports no speed.",
    )


RULES: tuple[RequirementRule, ...] = (
    RequirementRule("gpu-single-model", Applies.ALWAYS, "All GPUs are the same model.", _gpu_single_model),
    RequirementRule("nvme-count", Applies.ALWAYS, "At least 2 NVMe drives.", _nvme_count),
    RequirementRule(
        "nvme-capacity",
        Applies.ALWAYS,
        "Total NVMe >= 1 TB per 2 GPUs, rounded up (decimal TB).",
        _nvme_capacity,
    ),
    RequirementRule("tpm2", Applies.ALWAYS, "A TPM 2.0 (or firmware TPM 2.0) is present.", _tpm2),
    RequirementRule("memory-vs-vram", Applies.PUBLIC_JOBS, "RAM >= 2 x total GPU memory.", _memory_vs_vram),
    RequirementRule(
        "pcie-lanes", Applies.PUBLIC_JOBS, ">= 8 PCIe lanes per GPU (not for SXM GPUs).", _pcie_lanes
    ),
    RequirementRule(
        "cpu-cores-per-gpu",
        Applies.PUBLIC_JOBS,
        ">= 2 physical cores per PCIe 3.0 GPU, >= 4 per PCIe 4.0+ GPU.",
        _cpu_cores_per_gpu,
    ),
    RequirementRule(
        "sata-drives",
        Applies.LOCAL_STORAGE,
        ">= 3 SATA drives of >= 2 TB (SSD or 7200 rpm HDD).",
        _sata_drives,
    ),
    RequirementRule("network-10gbe", Applies.CENTRAL_STORAGE, "A NIC of >= 10 Gb/s.", _network_10gbe),
)


def check(
    inventory: Inventory, storage_mode: str | StorageMode | None = None, public_jobs: bool = False
) -> RequirementReport:
    """Evaluate every rule that applies to a node of this region kind."""
    mode = StorageMode(storage_mode) if storage_mode is not None else None
    results = []
    # A recognised Jetson (inventory.device) is an edge device, not a server: the server rules (drives,
    # 10 GbE, GPUs) do not apply to it. The control plane accepts such a report only from a node added
    # as a device (provision device add), so a compute or storage node gains nothing by it.
    rules = () if inventory.device is not None else RULES
    for rule in rules:
        if not rule.applies.holds(mode, public_jobs):
            continue
        measured = rule.measure(inventory)
        results.append(RuleResult(rule.id, measured.ok, measured.required, measured.found, measured.detail))
    return RequirementReport(
        ok=all(r.ok for r in results), rules=results, storage_mode=mode, public_jobs=public_jobs
    )
