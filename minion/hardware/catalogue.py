"""The GPU catalogue (regions/gpus.yaml): facts about a GPU that its PCI id implies.

Looked up in this order: the file the settings name ($RIGBASE_GPU_CATALOGUE, minion/settings.py), the
source tree's regions/gpus.yaml (development and tests), /usr/share/rigbase/gpus.yaml (where the boot
image installs it). A missing catalogue is not
fatal: GPUs are still counted, just without name, VRAM and form factor, and the inventory says why.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from minion.hardware.model import FormFactor, GpuClass

_CANDIDATES = (
    Path(__file__).resolve().parents[2] / "regions" / "gpus.yaml",
    # a wheel install ships regions/*.yaml as data files under <prefix>/share/rigbase (pyproject.toml)
    Path(sys.prefix) / "share" / "rigbase" / "gpus.yaml",
    Path("/usr/share/rigbase/gpus.yaml"),
)


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


class CatalogueMissing(FileNotFoundError):
    pass


def catalogue_path(override: Path | None = None) -> Path:
    """`override` (MinionSettings.gpu_catalogue) when given, else the first catalogue found."""
    if override is not None:
        return override
    for candidate in _CANDIDATES:
        if candidate.is_file():
            return candidate
    raise CatalogueMissing(
        "no GPU catalogue found; set RIGBASE_GPU_CATALOGUE or install regions/gpus.yaml "
        "as /usr/share/rigbase/gpus.yaml"
    )


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
