"""The GCP catalogue: the ten allowed regions, their zones and GPU types (regions/gcp-*.yaml).

Catalogue data stays out of code (as in SkyPilot) so a price or zone update is a data change; this
module only loads and types it. Loaded once per process: the files are small and never change at run
time."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from contracts.catalogue import catalogue_dir
from contracts.errors import InvalidInput

GPU_COUNTS = (1, 2, 4, 8)  # what every GPU machine family offers per VM
G2_BY_GPUS = {
    1: ("g2-standard-8", 8),
    2: ("g2-standard-24", 24),
    4: ("g2-standard-48", 48),
    8: ("g2-standard-96", 96),
}


@dataclass(frozen=True)
class GpuType:
    """One GPU type as the quota rule sees it (see regions/gcp-gpus.yaml for where each number comes from)."""

    name: str
    metric: str
    accelerator: str
    machine_family: str
    machine_type: str
    cpu_metric: str | None
    cpus_per_gpu: int
    price_per_gpu_hour: float
    spot_price_per_gpu_hour: float | None = None  # an estimate (see the yaml); None = no Spot offer
    job_gpu_type: str | None = None  # the job spec's name (contracts/gpu_types.py); None = not for jobs
    machine_memory_gb: float = 0.0  # the machine type's memory (the match table shows it)

    def machine_for(self, count: int) -> tuple[str, int]:
        """(machine type, vCPUs) of a VM with `count` of this GPU: N1 takes cpus_per_gpu × count vCPUs
        and the GPUs as accelerators; A2/A3 machine types are named by their GPU count; G2's sizes are a
        table (docs.cloud.google.com/compute/docs/gpus)."""
        if count not in GPU_COUNTS:
            raise InvalidInput(f"--gpu-count {count}: a {self.name} VM has 1, 2, 4 or 8 GPUs")
        if self.machine_family == "N1":
            return f"n1-standard-{self.cpus_per_gpu * count}", self.cpus_per_gpu * count
        if self.machine_family == "G2":
            return G2_BY_GPUS[count]
        return self.machine_type.replace("-1g", f"-{count}g"), self.cpus_per_gpu * count

    @property
    def attaches_accelerator(self) -> bool:
        """N1 machines take the GPU as a guest accelerator; A2/G2/A3 machine types bundle theirs (the
        insert still names it: Compute checks it against the machine type)."""
        return self.machine_family == "N1"


@dataclass(frozen=True)
class GcpRegion:
    name: str
    location: str
    zones: tuple[str, ...]
    gpu_zones: dict[str, tuple[str, ...]]  # GPU type name -> zones offering it


@dataclass(frozen=True)
class Catalogue:
    regions: dict[str, GcpRegion]
    gpus: dict[str, GpuType]
    price_date: str
    price_source: str

    def region(self, name: str) -> GcpRegion:
        """The catalogue entry for a GCP region; InvalidInput naming the allowed ones otherwise."""
        try:
            return self.regions[name]
        except KeyError:
            raise InvalidInput(
                f"GCP region '{name}' is not in rigbase's catalogue: "
                f"choose one of {', '.join(sorted(self.regions))}"
            ) from None

    def gpus_in(self, region: str) -> list[GpuType]:
        """GPU types offered in a region, in catalogue order."""
        offered = self.region(region).gpu_zones
        return [gpu for name, gpu in self.gpus.items() if name in offered]


@lru_cache(maxsize=4)
def load(directory: Path | None = None) -> Catalogue:
    base = directory or catalogue_dir()
    gpus_doc = yaml.safe_load((base / "gcp-gpus.yaml").read_text())
    regions_doc = yaml.safe_load((base / "gcp-regions.yaml").read_text())
    gpus = {
        name: GpuType(
            name=name,
            metric=g["metric"],
            accelerator=g["accelerator"],
            machine_family=g["machine_family"],
            machine_type=g["machine_type"],
            cpu_metric=g.get("cpu_metric"),
            cpus_per_gpu=int(g["cpus_per_gpu"]),
            price_per_gpu_hour=float(g["price_per_gpu_hour"]),
            spot_price_per_gpu_hour=(
                float(g["spot_price_per_gpu_hour"]) if g.get("spot_price_per_gpu_hour") is not None else None
            ),
            job_gpu_type=g.get("job_gpu_type"),
            machine_memory_gb=float(g.get("machine_memory_gb") or 0.0),
        )
        for name, g in gpus_doc["gpus"].items()
    }
    regions = {}
    for name, r in regions_doc["regions"].items():
        unknown = set(r["gpus"]) - set(gpus)
        if unknown:  # a typo in the data must not silently drop a GPU type
            raise ValueError(f"regions/gcp-regions.yaml: {name} lists unknown GPU types {sorted(unknown)}")
        regions[name] = GcpRegion(
            name=name,
            location=r["location"],
            zones=tuple(r["zones"]),
            gpu_zones={gpu: tuple(zones) for gpu, zones in r["gpus"].items()},
        )
    return Catalogue(
        regions=regions,
        gpus=gpus,
        price_date=str(gpus_doc["price_date"]),
        price_source=gpus_doc["price_source"],
    )
