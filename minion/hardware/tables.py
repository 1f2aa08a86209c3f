"""Human-readable tables for `minion inventory` and `minion check` (Rich, ASCII boxes so a serial
console and a log file show them the same; verdicts are words, not colours)."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table

from minion.hardware.model import Inventory
from minion.hardware.requirements import RequirementReport
from minion.hardware.units import gib, link_speed, storage


def _console() -> Console:
    return Console(highlight=False, soft_wrap=False)


def print_inventory(inv: Inventory) -> None:
    console = _console()
    console.print(
        f"Host {inv.hostname}: {inv.cpu.physical_cores} cores / {inv.cpu.threads} threads "
        f"({inv.cpu.sockets} socket(s), {inv.cpu.model or 'CPU model unknown'}), "
        f"{gib(inv.memory_total_bytes)} RAM"
    )
    tpm = inv.tpm
    console.print(
        "TPM: "
        + (
            f"{tpm.device}, version {tpm.major_version or 'unknown'} ({tpm.source})"
            if tpm.present
            else "none"
        )
    )
    gpus = Table("PCI address", "GPU", "VRAM", "class", "form", "lanes", "PCIe", box=box.ASCII, title="GPUs")
    for g in inv.gpus:
        lanes = f"x{g.link.current_width or '?'}/x{g.link.max_width or '?'}"
        gpus.add_row(
            g.pci_address,
            g.name,
            gib(g.vram_bytes) if g.vram_bytes else "?",
            g.gpu_class.value if g.gpu_class else "?",
            g.form_factor.value,
            lanes,
            f"{g.pcie_gen}.0" if g.pcie_gen else "?",
        )
    console.print(gpus if inv.gpus else "GPUs: none")
    drives = Table("drive", "kind", "size", "media", "model", box=box.ASCII, title="Drives")
    for d in inv.drives:
        media = ("HDD" + (f" {d.rpm} rpm" if d.rpm else "")) if d.rotational else "SSD"
        drives.add_row(d.name, d.kind.value, storage(d.size_bytes), media, d.model or "")
    console.print(drives if inv.drives else "Drives: none (NVMe, SATA or SAS)")
    nics = Table("NIC", "speed", "link", "MAC", box=box.ASCII, title="Network")
    for n in inv.nics:
        nics.add_row(
            n.name, link_speed(n.speed_mbps), {True: "up", False: "down", None: "?"}[n.link_up], n.mac or ""
        )
    console.print(nics if inv.nics else "NICs: no physical Ethernet interfaces")
    for note in inv.notes:
        console.print(f"note: {note}")


def print_report(report: RequirementReport) -> None:
    console = _console()
    table = Table(
        "result", "rule", "required", "found", box=box.ASCII, title=f"Hardware requirements ({report.scope})"
    )
    for r in report.rules:
        table.add_row("pass" if r.ok else "FAIL", r.rule, r.required, r.found)
    console.print(table)
    for r in report.failed:
        console.print(f"FAIL {r.rule}: {r.detail}")
    passed = len(report.rules) - len(report.failed)
    console.print(
        f"{passed} of {len(report.rules)} requirements pass"
        + ("." if report.ok else "; fix the failures above and run `minion check` again.")
    )
