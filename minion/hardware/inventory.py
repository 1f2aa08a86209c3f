"""`collect()`: the whole inventory of this machine (or of the umockdev testbed the process runs in).

GPU facts are merged from three places, each recorded in `Gpu.sources`: NVML when the NVIDIA driver is
bound (exact name, usable memory, PCIe link, SXM or PCIe), sysfs (PCIe link; amdgpu's VRAM), and the
catalogue in regions/gpus.yaml (model, fee class, form factor, and the rest when no driver is loaded).
"""

from __future__ import annotations

from pathlib import Path

from contracts.catalogue import CatalogueMissing
from minion.gpu.health import NvmlReader
from minion.hardware import catalogue, devices, hostfiles, jetson, nvml
from minion.hardware.addresses import local_addresses
from minion.hardware.model import Address, FormFactor, Gpu, Inventory
from minion.hardware.units import GIB


def collect(
    host_root: Path | None = None, catalogue_file: Path | None = None, nvml_reader: NvmlReader | None = None
) -> Inventory:
    """`catalogue_file`: MinionSettings.gpu_catalogue (None: the source tree's, then the installed one);
    `nvml_reader`: where NVML's answers come from (None: this machine's NVML)."""
    import pyudev  # heavy-ish (ctypes + libudev); only the commands that need it pay for it

    context = pyudev.Context()
    notes: list[str] = []
    pci_gpus = devices.gpus(context)
    nvml_facts: dict[str, nvml.NvmlFacts] = {}
    nvidia_bound = [g.pci_address for g in pci_gpus if g.driver == "nvidia"]
    if nvidia_bound:
        nvml_facts, problem = nvml.query(nvidia_bound, nvml_reader)
        if problem:
            notes.append(problem)
    entries: dict[tuple[str, str], catalogue.CatalogueEntry] | None
    try:
        entries = catalogue.load(catalogue.catalogue_path(catalogue_file))
    except (catalogue.CatalogueMissing, OSError) as exc:
        entries = None
        notes.append(f"GPU catalogue unreadable: {exc}")
    gpus = [_merge(g, nvml_facts.get(g.pci_address), entries, notes) for g in pci_gpus]
    try:
        device = jetson.recognise(host_root, notes=notes)
    except (jetson.UnsupportedJetson, CatalogueMissing) as exc:
        device = None  # still a machine with an inventory; the note says why it is no device
        notes.append(str(exc))
    return Inventory(
        hostname=hostfiles.hostname(host_root),
        cpu=hostfiles.cpu(host_root),
        memory_total_bytes=hostfiles.memory_total_bytes(host_root),
        tpm=devices.tpm(context),
        gpus=gpus,
        drives=devices.drives(context),
        nics=devices.nics(context),
        addresses=[Address(interface, address) for interface, address in local_addresses(host_root)],
        notes=notes,
        device=device,
    )


def _merge(
    found: devices.PciGpu,
    live: nvml.NvmlFacts | None,
    entries: dict[tuple[str, str], catalogue.CatalogueEntry] | None,
    notes: list[str],
) -> Gpu:
    vendor = devices.GPU_VENDORS[found.vendor_id]
    pci_id = f"{found.vendor_id}:{found.device_id}"
    key = (found.vendor_id.lower(), found.device_id.lower())
    entry = entries.get(key) if entries is not None else None
    sources = {"link": "sysfs"}
    gpu = Gpu(
        pci_address=found.pci_address,
        vendor_id=found.vendor_id,
        device_id=found.device_id,
        vendor=vendor,
        name=f"{vendor} {pci_id}",
        model=pci_id,
        driver=found.driver,
        link=found.link,
        sources=sources,
    )
    if entry is not None:
        gpu.name, gpu.model = entry.name, entry.model
        gpu.vram_bytes = entry.vram_gib * GIB
        gpu.gpu_class, gpu.form_factor = entry.gpu_class, entry.form_factor
        gpu.catalogue_pcie_gen = entry.pcie_gen
        sources.update(
            name="catalogue",
            model="catalogue",
            vram="catalogue",
            gpu_class="catalogue",
            form_factor="catalogue",
        )
    else:
        sources.update(name="pci id", model="pci id")
        notes.append(
            f"GPU {pci_id} at {found.pci_address} is not in the GPU catalogue: its fee class "
            "and form factor are unknown (it is treated as a PCIe card)."
        )
    if found.sysfs_vram_bytes:
        gpu.vram_bytes, sources["vram"] = found.sysfs_vram_bytes, "sysfs"
    if live is not None:
        gpu.name, sources["name"] = live.name, "nvml"
        gpu.vram_bytes, sources["vram"] = live.memory_total_bytes, "nvml"
        if entry is None:
            # Without a catalogue entry NVML's name is the best model key we have.
            gpu.model, sources["model"] = live.name, "nvml"
        _nvml_link(gpu, live)
    if gpu.form_factor is FormFactor.UNKNOWN:
        sources["form_factor"] = "unknown"
    return gpu


def _nvml_link(gpu: Gpu, live: nvml.NvmlFacts) -> None:
    """NVML's link and form factor over sysfs's and the catalogue's: the driver reads the GPU's own
    registers, where a riser or a bridge can hide the link from sysfs."""
    if live.pcie_width is not None or live.pcie_gen is not None:
        gpu.link.current_width = live.pcie_width or gpu.link.current_width
        gpu.link.max_width = live.pcie_max_width or gpu.link.max_width
        gpu.link.max_generation = live.pcie_gen
        gpu.sources["link"] = "nvml"
    if live.sxm is not None:
        gpu.form_factor = FormFactor.SXM if live.sxm else FormFactor.PCIE
        gpu.sources["form_factor"] = "nvml"
