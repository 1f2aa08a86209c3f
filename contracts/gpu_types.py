"""GPU type names: the catalogue's (regions/gpus.yaml `model`), and the other spellings job files use.

A node reports its GPUs by catalogue model; a job asks for GPU types. Job files from elsewhere spell them
their own way (trainML "A100 (80GB)", ChainOpera Launch "A100-80G", GCP "A100_80GB", nvidia-smi "NVIDIA
A100-SXM4-80GB"): `resolve_gpu_type` maps each to catalogue names, or says which names come closest."""

from __future__ import annotations

import difflib
import re
from typing import Final

from contracts import catalogue

# The GPU types a job may ask for: the `model` names of the GPU catalogue regions/gpus.yaml, which is what a
# node reports for its GPUs. Catalogue order.
GPU_TYPES: Final[tuple[str, ...]] = catalogue.gpu_models()
# The AMD types of the catalogue (vendor 1002); the others are NVIDIA's. A file format that names no GPU type
# but means CUDA (OpenPAI) asks for the NVIDIA ones.
AMD_GPU_TYPES: Final[frozenset[str]] = catalogue.amd_gpu_models()
NVIDIA_GPU_TYPES: Final[tuple[str, ...]] = tuple(t for t in GPU_TYPES if t not in AMD_GPU_TYPES)

# Other spellings, compared after `gpu_key()` (so "A100 (80GB)", "A100-80G", "NVIDIA A100-SXM4-80GB" and
# GCP's "A100_80GB" all reach the catalogue name without an entry here). A family name without a memory size
# means every model of that family.
GPU_ALIASES: Final[dict[str, tuple[str, ...]]] = {
    "A100": ("A100 40GB", "A100 80GB"),
    "H100": ("H100 80GB", "H100 NVL"),
    "H100 94GB": ("H100 NVL",),
    "H200": ("H200 141GB",),
    "A6000": ("RTX A6000",),
    "A4000": ("RTX A4000",),
    "RTX 6000 Ada Generation": ("RTX 6000 Ada",),
    "MI250": ("MI250/MI250X",),
    "MI250X": ("MI250/MI250X",),
    "W7900": ("Radeon Pro W7900",),
}

# Vendor words and form factors that do not change which GPU type is meant.
_NOISE_TOKENS: Final = frozenset({"nvidia", "geforce", "tesla", "amd", "instinct", "pcie"})
_SXM = re.compile(r"sxm\d*")


def gpu_key(name: str) -> str:
    """The spelling-free key of a GPU type name: lower case, vendor words and form factors dropped,
    punctuation removed, and a memory size's "G" read as "GB" ("A100-80G" -> "a10080gb")."""
    tokens = [t for t in re.findall(r"[a-z0-9]+", name.lower()) if t not in _NOISE_TOKENS]
    tokens = [t for t in tokens if not _SXM.fullmatch(t)]
    return re.sub(r"(\d)g$", r"\1gb", "".join(re.sub(r"^(\d+)g$", r"\1gb", t) for t in tokens))


_BY_KEY: Final[dict[str, tuple[str, ...]]] = {
    **{gpu_key(alias): models for alias, models in GPU_ALIASES.items()},
    **{gpu_key(name): (name,) for name in GPU_TYPES},
}


def resolve_gpu_type(name: str) -> tuple[str, ...]:
    """The catalogue GPU types a name means ("A100 (80GB)" -> ("A100 80GB",), "A100" -> both A100s);
    ValueError naming the closest catalogue names when it means none."""
    models = _BY_KEY.get(gpu_key(name)) if name.strip() else None
    if models:
        return models
    close = difflib.get_close_matches(name, GPU_TYPES, n=3, cutoff=0.5) if len(name) <= 64 else []
    hint = f"did you mean {' or '.join(close)}?" if close else f"use one of {', '.join(GPU_TYPES)}"
    raise ValueError(f"unknown GPU type {name!r}: {hint}")
