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
    # trainML's GPU ids that the rules above do not reach (TRAINML_GPU_IDS has all of them)
    "rtx2060s": ("RTX 2060 Super",),
    "rtx2070s": ("RTX 2070 Super",),
    "a100xl": ("A100 80GB",),
}

# trainML's own GPU ids (its SDK's and CLI's `gpu_types`), each one catalogue type; "cpu" is a CPU-only job.
TRAINML_GPU_IDS: Final[dict[str, tuple[str, ...]]] = {
    "gtx1060": ("GTX 1060",),
    "rtx2060s": ("RTX 2060 Super",),
    "rtx2070s": ("RTX 2070 Super",),
    "rtx2080ti": ("RTX 2080 Ti",),
    "rtx3090": ("RTX 3090",),
    "p100": ("P100",),
    "t4": ("T4",),
    "v100": ("V100",),
    "a100": ("A100 40GB",),  # trainML's "A100 (40GB)"; its 80 GB one is a100xl
    "a100xl": ("A100 80GB",),
    "a6000": ("RTX A6000",),
    "a4000": ("RTX A4000",),
}
TRAINML_CPU: Final = "cpu"

# Vendor words, form factors and memory kinds that do not change which GPU type is meant (nvidia-smi
# prints "NVIDIA H100 80GB HBM3", "NVIDIA RTX 6000 Ada Generation").
_NOISE_TOKENS: Final = frozenset(
    {
        "nvidia",
        "geforce",
        "tesla",
        "amd",
        "instinct",
        "pcie",
        "hbm2",
        "hbm2e",
        "hbm3",
        "hbm3e",
        "gddr6",
        "gddr6x",
    }
)
# a memory size at the end of a name whose catalogue type has none ("Tesla V100-SXM2-16GB" is a V100)
_MEMORY = re.compile(r"\d+gb?")
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
    if not models:
        tokens = re.findall(r"[a-z0-9]+", name.lower())
        if len(tokens) > 1 and _MEMORY.fullmatch(tokens[-1]):
            sized = _BY_KEY.get(gpu_key(" ".join(tokens[:-1])))
            # only a type the catalogue keeps without sizes: "A100 48GB" is no A100 of the catalogue
            if sized and not any(_MEMORY.search(m.lower().split()[-1]) for m in sized):
                models = sized
    if models:
        return models
    close = difflib.get_close_matches(name, GPU_TYPES, n=3, cutoff=0.5) if len(name) <= 64 else []
    hint = f"did you mean {' or '.join(close)}?" if close else f"use one of {', '.join(GPU_TYPES)}"
    raise ValueError(f"unknown GPU type {name!r}: {hint}")
