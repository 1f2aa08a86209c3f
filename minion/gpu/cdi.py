"""The CDI spec for a node's NVIDIA driver (docs/minion-jobs.md, "GPUs"): what `nvidia-ctk cdi generate`
writes for the same installation, by the Container Device Interface's own schema (cdiVersion 0.5.0, which
podman 4.3 reads), with the toolkit's hooks replaced by mounts (minion/gpu/driver.py says why):

- kind `nvidia.com/gpu`; one device per GPU by index ("0") and, where NVML gives it, by UUID, each with
  its /dev/nvidiaN; and `all`, with every GPU's node;
- spec-wide edits every device shares: NVIDIA_VISIBLE_DEVICES=void (as the toolkit sets, so an image's
  own NVIDIA hook does nothing more), the control nodes, and read-only mounts (nosuid, nodev, rbind,
  rprivate) of the libraries, their aliases, the binaries, the IPC sockets and the GSP firmware.

The minion writes it to /var/run/cdi/rigbase-nvidia.yaml at start and again when the driver's version or
its GPUs change (a tmpfs, as a node's /etc is read-only), and leaves alone a spec of the same kind that
the operator's own toolkit wrote."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Final

import yaml

from minion.gpu.driver import DriverInstall, HostFile

CDI_VERSION: Final = "0.5.0"
KIND: Final = "nvidia.com/gpu"
SPEC_NAME: Final = "rigbase-nvidia.yaml"
MOUNT_OPTIONS: Final = ["ro", "nosuid", "nodev", "rbind", "rprivate"]


def _node(driver: DriverInstall, path: str) -> dict[str, str]:
    return {"path": path, "hostPath": driver.host(path)}


def _mount(f: HostFile) -> dict[str, Any]:
    return {"hostPath": f.host, "containerPath": f.container, "options": list(MOUNT_OPTIONS)}


def spec(driver: DriverInstall, kind: str = KIND) -> dict[str, Any]:
    devices: list[dict[str, Any]] = []
    for gpu in driver.gpus:
        own = {"deviceNodes": [_node(driver, f"/dev/nvidia{gpu.minor}")]}
        devices.append({"name": str(gpu.index), "containerEdits": own})
        if gpu.uuid:
            devices.append({"name": gpu.uuid, "containerEdits": own})
    every = [_node(driver, f"/dev/nvidia{gpu.minor}") for gpu in driver.gpus]
    devices.append({"name": "all", "containerEdits": {"deviceNodes": every}})
    files = [*driver.libraries, *driver.aliases, *driver.binaries, *driver.sockets, *driver.firmware]
    edits: dict[str, Any] = {"env": ["NVIDIA_VISIBLE_DEVICES=void"]}
    if driver.control_nodes:
        edits["deviceNodes"] = [_node(driver, path) for path in driver.control_nodes]
    edits["mounts"] = [_mount(f) for f in files]
    return {"cdiVersion": CDI_VERSION, "kind": kind, "devices": devices, "containerEdits": edits}


def render(document: dict[str, Any]) -> str:
    return "---\n" + yaml.safe_dump(document, sort_keys=False, default_flow_style=False)


def foreign_spec(directories: list[Path], kind: str = KIND) -> Path | None:
    """A spec of `kind` that is not ours (the operator's own `nvidia-ctk cdi generate`), if any."""
    for directory in directories:
        if not directory.is_dir():
            continue
        for path in sorted(directory.iterdir()):
            if path.name == SPEC_NAME or path.suffix not in (".yaml", ".yml", ".json"):
                continue
            try:
                loaded = yaml.safe_load(path.read_text())  # JSON is YAML too
            except (OSError, yaml.YAMLError):
                continue
            if isinstance(loaded, dict) and loaded.get("kind") == kind:
                return path
    return None


def write_atomically(path: Path, text: str) -> Path:
    """Podman never reads half a spec; raises OSError with the reason."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o644)
    tmp.replace(path)
    return path


def write(document: dict[str, Any], directory: Path) -> Path:
    """The minion's own spec in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    return write_atomically(directory / SPEC_NAME, render(document))
