"""The node's GPUs as CDI names them, and which worker holds which.

On a real node the NVIDIA Container Toolkit writes a CDI spec (`nvidia-ctk cdi generate --output
/etc/cdi/nvidia.yaml`) whose devices of kind `nvidia.com/gpu` are named by index ("0", "1", … and "all").
The minion reads the same spec directories podman reads, takes the index-named devices of the configured
kind as the node's GPUs, and hands each worker whole GPUs that no other worker holds; the container gets
them with `--device KIND=INDEX`. Holdings are rebuilt at adoption from the container's rigbase.gpus
label, so a restart never gives a held GPU to a second worker."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

WorkerKey = tuple[str, int]


class NotEnoughGpus(Exception):
    """Fewer free GPUs than a worker asks for; the message says how many there are."""


def _load(path: Path) -> dict[str, Any]:
    text = path.read_text()
    loaded = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    return loaded if isinstance(loaded, dict) else {}


def cdi_gpus(spec_dirs: Iterable[Path], kind: str) -> list[int]:
    """Indices of the devices of `kind` in the CDI specs under `spec_dirs` (unreadable specs are skipped:
    podman would refuse them too, and the worker then fails to start with podman's reason)."""
    found: set[int] = set()
    for directory in spec_dirs:
        if not directory.is_dir():
            continue
        for path in sorted(directory.iterdir()):
            if path.suffix not in (".json", ".yaml", ".yml"):
                continue
            try:
                spec = _load(path)
            except (OSError, ValueError, yaml.YAMLError):
                continue
            if spec.get("kind") != kind:
                continue
            for device in spec.get("devices") or []:
                name = str(device.get("name", "")) if isinstance(device, dict) else ""
                if name.isdigit():
                    found.add(int(name))
    return sorted(found)


@dataclass
class GpuPool:
    """Whole GPUs handed to workers; thread-safe (workers start in their own threads)."""

    spec_dirs: tuple[Path, ...]
    kind: str
    held: dict[WorkerKey, list[int]] = field(default_factory=dict)
    why_none: Callable[[], str | None] = lambda: None  # why the node's spec is missing (the CdiKeeper's note)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def adopt(self, key: WorkerKey, indices: list[int]) -> None:
        with self.lock:
            self.held[key] = list(indices)

    def take(self, key: WorkerKey, count: int) -> list[int]:
        """`count` GPUs no other worker holds (the lowest free indices), or NotEnoughGpus."""
        if count == 0:
            return []
        with self.lock:
            if key in self.held:
                return self.held[key]
            present = cdi_gpus(self.spec_dirs, self.kind)
            busy = {i for indices in self.held.values() for i in indices}
            free = [i for i in present if i not in busy]
            if len(free) < count:
                where = ", ".join(str(d) for d in self.spec_dirs)
                why = self.why_none() if not present else None
                raise NotEnoughGpus(
                    f"needs {count} GPU(s) of CDI kind {self.kind}; {len(free)} of {len(present)} free "
                    f"on this node (CDI specs in {where})" + (f": {why}" if why else "")
                )
            self.held[key] = free[:count]
            return self.held[key]

    def release(self, key: WorkerKey) -> None:
        with self.lock:
            self.held.pop(key, None)
