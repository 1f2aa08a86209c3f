"""The CDI spec for a node's NVIDIA driver (docs/minion-jobs.md, "GPUs"): what `nvidia-ctk cdi generate`
writes for the same installation, by the Container Device Interface's own schema (cdiVersion 0.5.0, which
podman 4.3 reads), with the toolkit's hooks replaced by mounts (minion/gpu/driver.py says why):

- kind `nvidia.com/gpu`; one device per GPU by index ("0") and, where NVML gives it, by UUID, each with
  its /dev/nvidiaN and its DRM card and render nodes (with their /dev/dri/by-path names); and `all`, with
  every GPU's nodes;
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

from minion.gpu import csv_mode
from minion.gpu.driver import DriverInstall, HostFile, NvmlView, discover

CDI_VERSION: Final = "0.5.0"
KIND: Final = "nvidia.com/gpu"
SPEC_NAME: Final = "rigbase-nvidia.yaml"
MOUNT_OPTIONS: Final = ["ro", "nosuid", "nodev", "rbind", "rprivate"]


def _device(f: HostFile) -> dict[str, str]:
    return {"path": f.container, "hostPath": f.host}


def _mount(f: HostFile) -> dict[str, Any]:
    return {"hostPath": f.host, "containerPath": f.container, "options": list(MOUNT_OPTIONS)}


def spec(driver: DriverInstall, kind: str = KIND) -> dict[str, Any]:
    devices: list[dict[str, Any]] = []
    every: list[dict[str, str]] = []
    for position, gpu in enumerate(driver.gpus):
        nodes = [_device(f) for f in driver.nodes_of(position)]
        own = {"deviceNodes": nodes}
        devices.append({"name": str(gpu.index), "containerEdits": own})
        if gpu.uuid:
            devices.append({"name": gpu.uuid, "containerEdits": own})
        every += nodes
    devices.append({"name": "all", "containerEdits": {"deviceNodes": every}})
    files = [*driver.libraries, *driver.aliases, *driver.binaries, *driver.sockets, *driver.firmware]
    edits: dict[str, Any] = {"env": ["NVIDIA_VISIBLE_DEVICES=void"]}
    if driver.control_nodes:
        edits["deviceNodes"] = [_device(HostFile(driver.host(p), p)) for p in driver.control_nodes]
    edits["mounts"] = [_mount(f) for f in files]
    return {"cdiVersion": CDI_VERSION, "kind": kind, "devices": devices, "containerEdits": edits}


def csv_spec(install: csv_mode.CsvInstall, kind: str = KIND) -> dict[str, Any]:
    """A Jetson's spec (minion/gpu/csv_mode.py): its one GPU as "0" and "all", the rest spec-wide."""
    nodes = {"deviceNodes": [_device(f) for f in install.device_nodes]}
    env = ["NVIDIA_VISIBLE_DEVICES=void"]
    if install.library_path:
        env.append("LD_LIBRARY_PATH=" + ":".join(install.library_path))
    edits = {"env": env, "mounts": [_mount(f) for f in install.mounts]}
    devices = [{"name": "0", "containerEdits": nodes}, {"name": "all", "containerEdits": nodes}]
    return {"cdiVersion": CDI_VERSION, "kind": kind, "devices": devices, "containerEdits": edits}


def node_spec(root: Path, nvml: NvmlView | None = None) -> tuple[dict[str, Any], str]:
    """The spec for the node under `root` and what it describes: the L4T CSV files' GPU where the root
    has them (a Jetson), else the driver installation; NoDriver says why there is none."""
    if csv_mode.csv_files(root):
        install = csv_mode.discover(root)
        return csv_spec(install), f"the L4T GPU ({len(install.files)} CSV file(s))"
    driver = discover(root, nvml=nvml)
    return spec(driver), f"driver {driver.version} ({len(driver.gpus)} GPU(s))"


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
