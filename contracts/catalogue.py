"""Where the catalogue data is found, and the names it defines that more than one program checks.

The catalogue is regions/*.yaml (GPU models, Jetson models, GCP regions and GPUs): the source tree's
regions/ (development, editable installs, tests), <prefix>/share/rigbase (a wheel install: pyproject.toml
data-files) or /usr/share/rigbase (where the boot image and the device bundle install it). The names a
job may ask for or a device may report are read from it, never copied into code."""

from __future__ import annotations

import sys
from enum import StrEnum
from functools import cache
from pathlib import Path
from typing import Any

CATALOGUE_DIRS: tuple[Path, ...] = (
    Path(__file__).resolve().parents[1] / "regions",
    Path(sys.prefix) / "share" / "rigbase",
    Path("/usr/share/rigbase"),
)


class GpuClass(StrEnum):
    """A GPU's fee class (regions/gpus.yaml `class`; docs/product-rules.md "Usage fee"): what the node
    reports of its GPUs and what billing charges by."""

    DEVELOPMENT = "development"  # GeForce, Radeon
    PROFESSIONAL = "professional"  # Quadro / RTX A-series, Radeon Pro
    DATACENTER = "datacenter"  # Tesla and successors (A100, H100 …), Radeon Instinct


class CatalogueMissing(FileNotFoundError):
    """No catalogue file of that name in any of CATALOGUE_DIRS."""


def catalogue_file(name: str, override: Path | None = None) -> Path:
    """`override` when given, else the first CATALOGUE_DIRS entry that holds `name`."""
    if override is not None:
        return override
    for directory in CATALOGUE_DIRS:
        if (directory / name).is_file():
            return directory / name
    raise CatalogueMissing(
        f"no catalogue file {name} found; install regions/{name} as /usr/share/rigbase/{name}"
    )


def catalogue_dir() -> Path:
    """The first of CATALOGUE_DIRS that holds the GPU catalogue (the one every install has)."""
    return catalogue_file("gpus.yaml").parent


def read(path: Path) -> Any:
    """A catalogue file, parsed (libyaml's loader where PyYAML was built with it)."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(path.read_text(), Loader=loader)


@cache
def gpu_models() -> tuple[str, ...]:
    """The `model` names of regions/gpus.yaml, in catalogue order: the GPU types a node reports and a
    job may ask for."""
    return tuple(
        dict.fromkeys(entry["model"] for entry in read(catalogue_file("gpus.yaml"))["gpus"].values())
    )


@cache
def amd_gpu_models() -> frozenset[str]:
    """The models of regions/gpus.yaml made by AMD (PCI vendor 1002); the others are NVIDIA's."""
    gpus = read(catalogue_file("gpus.yaml"))["gpus"]
    return frozenset(entry["model"] for pci, entry in gpus.items() if pci.lower().startswith("1002:"))


@cache
def device_models() -> tuple[str, ...]:
    """The model keys of regions/jetson.yaml, in catalogue order: what a device may report itself as."""
    return tuple(read(catalogue_file("jetson.yaml"))["models"])
