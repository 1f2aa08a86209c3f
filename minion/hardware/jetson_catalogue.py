"""The Jetson catalogue (regions/jetson.yaml): the facts a Jetson's device tree implies.

Found where every catalogue file is (contracts/catalogue.py). Only a
machine whose device tree says Tegra reads it, so a compute node never needs the file.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from contracts.catalogue import catalogue_file
from contracts.device import DeviceTpm


@dataclass(frozen=True)
class Soc:
    key: str
    chip_id: int
    compatible: str


@dataclass(frozen=True)
class Variant:
    modules: tuple[str, ...]
    memory_gib: int
    gpu_cores: int
    dla_count: int


@dataclass(frozen=True)
class JetsonModel:
    key: str
    name: str
    soc: Soc
    tpm: DeviceTpm
    model_strings: tuple[str, ...]
    compatible: tuple[str, ...]
    devkit_model: str
    devkit_compatible: tuple[str, ...]
    variants: tuple[Variant, ...]

    def variant_for_memory(self, memory_total_bytes: int) -> Variant | None:
        """The smallest variant whose memory holds MemTotal (the kernel always sees less than the module
        has: firmware carve-outs), or None when MemTotal exceeds every variant."""
        for variant in sorted(self.variants, key=lambda v: v.memory_gib):
            if memory_total_bytes <= variant.memory_gib * 2**30:
                return variant
        return None


@dataclass(frozen=True)
class JetsonCatalogue:
    socs: dict[str, Soc]
    models: dict[str, JetsonModel]
    jetpack: dict[str, str]  # L4T release ("R35.4.1") -> JetPack release ("5.1.2")

    def by_module(self) -> dict[str, tuple[JetsonModel, Variant]]:
        """{module part number: (model, variant)}."""
        return {m: (model, v) for model in self.models.values() for v in model.variants for m in v.modules}


def catalogue_path() -> Path:
    return catalogue_file("jetson.yaml")


@lru_cache(maxsize=4)
def load(path: Path | None = None) -> JetsonCatalogue:
    import yaml

    document: dict[str, Any] = yaml.safe_load((path or catalogue_path()).read_text())
    socs = {
        key: Soc(key=key, chip_id=int(raw["chip_id"]), compatible=str(raw["compatible"]))
        for key, raw in document["socs"].items()
    }
    models = {
        key: JetsonModel(
            key=key,
            name=raw["name"],
            soc=socs[raw["soc"]],
            tpm=DeviceTpm(raw["tpm"]),
            model_strings=tuple(raw["model_strings"]),
            compatible=tuple(raw["compatible"]),
            devkit_model=raw["devkit"]["model"],
            devkit_compatible=tuple(raw["devkit"]["compatible"]),
            variants=tuple(
                Variant(
                    modules=tuple(v["modules"]),
                    memory_gib=int(v["memory_gib"]),
                    gpu_cores=int(v["gpu_cores"]),
                    dla_count=int(v["dla_count"]),
                )
                for v in raw["variants"]
            ),
        )
        for key, raw in document["models"].items()
    }
    jetpack = {str(release): str(version) for release, version in document["jetpack"].items()}
    return JetsonCatalogue(socs=socs, models=models, jetpack=jetpack)
