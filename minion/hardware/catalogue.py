"""The GPU catalogue (regions/gpus.yaml): facts about a GPU that its PCI id implies.

Looked up in this order: the file the settings name ($RIGBASE_GPU_CATALOGUE, minion/settings.py), then
where contracts/catalogue.py finds catalogue files (the source tree, a wheel install, /usr/share/rigbase,
where the boot image installs it). A missing catalogue is not
fatal: GPUs are still counted, just without name, VRAM and form factor, and the inventory says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from contracts.catalogue import CatalogueMissing, GpuClass, catalogue_file
from minion.hardware.model import FormFactor


@dataclass(frozen=True)
class CatalogueEntry:
    vendor_id: str
    device_id: str
    name: str
    model: str
    vram_gib: int
    gpu_class: GpuClass
    form_factor: FormFactor
    pcie_gen: int
    sources: dict[str, str]


def catalogue_path(override: Path | None = None) -> Path:
    """`override` (MinionSettings.gpu_catalogue) when given, else the first catalogue found."""
    try:
        return catalogue_file("gpus.yaml", override)
    except CatalogueMissing as exc:
        raise CatalogueMissing(f"{exc}, or set RIGBASE_GPU_CATALOGUE") from None


@lru_cache(maxsize=4)
def load(path: Path | None = None) -> dict[tuple[str, str], CatalogueEntry]:
    """{(vendor_id, device_id): entry}, ids lower-case hex without 0x."""
    import yaml

    path = path or catalogue_path()
    document = yaml.safe_load(path.read_text())
    named_sources: dict[str, str] = document.get("sources", {})
    entries: dict[tuple[str, str], CatalogueEntry] = {}
    for key, raw in document["gpus"].items():
        vendor_id, device_id = (part.lower() for part in key.split(":"))
        entries[(vendor_id, device_id)] = CatalogueEntry(
            vendor_id=vendor_id,
            device_id=device_id,
            name=raw["name"],
            model=raw["model"],
            vram_gib=int(raw["vram_gib"]),
            gpu_class=GpuClass(raw["class"]),
            form_factor=FormFactor(raw["form_factor"]),
            pcie_gen=int(raw["pcie_gen"]),
            # Expand the short source keys so the inventory carries the citation itself.
            sources={fact: named_sources.get(ref, ref) for fact, ref in raw["sources"].items()},
        )
    return entries
