"""What an NVIDIA driver installation under a host root gives a container, found as the NVIDIA Container
Toolkit (`nvidia-ctk cdi generate`, its pkg/nvcdi) finds it, without the toolkit (Debian does not ship it,
and a node's verity root cannot install it):

- the GPUs: from NVML (index, UUID, minor number, PCI bus id) when the driver is loaded, else the
  /dev/nvidiaN nodes (with the bus id the driver's /proc/driver/nvidia/gpus/BUS/information gives);
- each GPU's DRM nodes: the card and render nodes its PCI device has under /sys/bus/pci/devices/BUS/drm,
  and the /dev/dri/by-path links to them (the toolkit's create-symlinks hook makes those links; a node
  at the link's path with the same device numbers serves the same opens);
- the driver version: NVML's, else /sys/module/nvidia/version, else /proc/driver/nvidia/version;
- the control device nodes (nvidiactl, nvidia-uvm, nvidia-uvm-tools, nvidia-modeset) that exist;
- the user-space libraries: every regular file named `*.so.VERSION` that the root's ld.so cache (read
  with the root's own `ldconfig -p -C`) or its library directories (and their `vdpau/`) hold, as the
  toolkit's version-suffix rule does (libcuda, libnvidia-ml, libnvidia-ptxjitcompiler and the rest);
- each library's aliases: the ld cache's sonames and the directories' links that lead to it
  (`libcuda.so.1`), plus `libcuda.so`, which the toolkit's create-symlinks hook adds; they replace the
  toolkit's hooks, whose binary a node does not have: mounted at those paths, Debian's and Ubuntu's
  dynamic linkers find them in their system search path (/lib/x86_64-linux-gnu, /usr/lib/x86_64-linux-gnu);
- the binaries (nvidia-smi, the persistence daemon, MPS), the IPC sockets, and the running driver's GSP
  firmware directory.

Every path is looked up inside `host_root` (symlinks resolved there, never on the machine running this),
and reported as the node sees it (`host`: with the root, `container`: without)."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Final

LIBRARY_DIRS: Final = (  # where a driver's libraries are when the ld cache does not say (Debian's first)
    "/usr/lib/x86_64-linux-gnu/nvidia/current",
    "/usr/lib/x86_64-linux-gnu",
    "/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/lib64",
    "/usr/lib/aarch64-linux-gnu",
    "/lib/aarch64-linux-gnu",
)
CONTROL_NODES: Final = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
BINARIES: Final = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
BINARY_DIRS: Final = ("/usr/bin", "/usr/sbin", "/bin", "/sbin")
SOCKETS: Final = ("/run/nvidia-persistenced/socket", "/run/nvidia-fabricmanager/socket")
VERSION_FILES: Final = ("sys/module/nvidia/version", "proc/driver/nvidia/version")
_VERSION: Final = re.compile(r"\b(\d+\.\d+(?:\.\d+)?)\b")
_GPU_NODE: Final = re.compile(r"^nvidia(\d+)$")
_DEVICE_MINOR: Final = re.compile(r"^Device Minor:\s*(\d+)\s*$", re.MULTILINE)
GPU_INFO_DIR: Final = "proc/driver/nvidia/gpus"
DRM_KINDS: Final = ("card", "renderD")  # the DRM nodes the toolkit gives a GPU (not controlD)
_LDCONFIG_LINE: Final = re.compile(r"^\s*(\S+) \(([^)]*)\) => (\S+)$")


class NoDriver(Exception):
    """No usable NVIDIA driver under the root; the message says what is missing."""


@dataclass(frozen=True)
class Gpu:
    index: int
    minor: int  # /dev/nvidiaMINOR
    uuid: str | None = None
    pci_bus_id: str | None = None  # sysfs form, 0000:3b:00.0


@dataclass(frozen=True)
class HostFile:
    """A file of the driver: where the node has it and where the container sees it."""

    host: str
    container: str


@dataclass(frozen=True)
class DriverInstall:
    root: Path
    version: str
    gpus: tuple[Gpu, ...]
    control_nodes: tuple[str, ...]  # container paths (/dev/nvidiactl …)
    libraries: tuple[HostFile, ...]
    aliases: tuple[HostFile, ...]  # soname and dev links, each to its library's host file
    binaries: tuple[HostFile, ...]
    sockets: tuple[HostFile, ...]
    firmware: tuple[HostFile, ...] = field(default=())
    drm: tuple[tuple[HostFile, ...], ...] = field(default=())  # per GPU, in `gpus` order: drm_nodes()

    def host(self, path: str) -> str:
        return host_path(self.root, path)

    def nodes_of(self, position: int) -> list[HostFile]:
        """The device nodes of the GPU at `position` in `gpus`: /dev/nvidiaMINOR, then its DRM nodes."""
        gpu = self.gpus[position]
        own = HostFile(self.host(f"/dev/nvidia{gpu.minor}"), f"/dev/nvidia{gpu.minor}")
        return [own, *(self.drm[position] if position < len(self.drm) else ())]


def host_path(root: Path, path: str) -> str:
    return str(root / path.lstrip("/")) if str(root) != "/" else path


def resolve_in_root(root: Path, path: str, *, hops: int = 40) -> str | None:
    """`path` with every symlink followed inside `root` (an absolute target is the root's, not this
    machine's); None when it leads nowhere."""
    parts = list(PurePosixPath(path).parts[1:])
    done = PurePosixPath("/")
    while parts:
        part = parts.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            done = done.parent
            continue
        candidate = done / part
        real = root / str(candidate).lstrip("/")
        if real.is_symlink():
            hops -= 1
            if hops < 0:
                return None
            target = PurePosixPath(os.readlink(real))
            parts = list(target.parts[1:] if target.is_absolute() else target.parts) + parts
            done = PurePosixPath("/") if target.is_absolute() else done
            continue
        if not real.exists():
            return None
        done = candidate
    return str(done)


def driver_version(root: Path, nvml_version: str | None = None) -> str:
    if nvml_version:
        return nvml_version
    for name in VERSION_FILES:
        try:
            text = (root / name).read_text()
        except OSError:
            continue
        if match := _VERSION.search(text):
            return match.group(1)
    raise NoDriver(
        f"no NVIDIA kernel module under {root}: neither NVML nor /sys/module/nvidia/version answers "
        "(is the driver installed and loaded? `modprobe nvidia`)"
    )


def sysfs_bus_id(bus_id: str) -> str:
    """NVML's `00000000:3B:00.0` as sysfs names it, `0000:3b:00.0` (as the toolkit shortens it)."""
    return bus_id.strip().lower()[-12:]


def _bus_ids_by_minor(root: Path) -> dict[int, str]:
    found: dict[int, str] = {}
    info_dir = root / GPU_INFO_DIR
    if info_dir.is_dir():
        for gpu_dir in info_dir.iterdir():
            try:
                match = _DEVICE_MINOR.search((gpu_dir / "information").read_text())
            except OSError:
                continue
            if match:
                found[int(match.group(1))] = sysfs_bus_id(gpu_dir.name)
    return found


def gpus_from_nodes(root: Path) -> tuple[Gpu, ...]:
    buses = _bus_ids_by_minor(root)
    found = []
    for node in (root / "dev").glob("nvidia*"):
        if match := _GPU_NODE.match(node.name):
            minor = int(match.group(1))
            found.append(Gpu(index=minor, minor=minor, pci_bus_id=buses.get(minor)))
    return tuple(sorted(found, key=lambda g: g.index))


def drm_nodes(root: Path, bus_id: str | None) -> tuple[HostFile, ...]:
    """The GPU's DRM card and render nodes, then the by-path links to them, each as (host node, the path
    the container sees); none without a bus id or a DRM driver bound to the GPU."""
    if not bus_id:
        return ()
    drm = root / "sys/bus/pci/devices" / bus_id / "drm"
    names = sorted(e.name for e in drm.iterdir() if e.name.startswith(DRM_KINDS)) if drm.is_dir() else []
    nodes = [f"/dev/dri/{name}" for name in names if (root / "dev/dri" / name).exists()]
    out = [HostFile(host_path(root, node), node) for node in nodes]
    for kind, suffix in (("card", "card"), ("renderD", "render")):
        link = f"/dev/dri/by-path/pci-{bus_id}-{suffix}"
        target = resolve_in_root(root, link)
        if target in nodes and PurePosixPath(target).name.startswith(kind):
            out.append(HostFile(host_path(root, target), link))
    return tuple(out)


def _ld_cache(root: Path) -> list[tuple[str, str]]:
    """(soname, path) of every 64-bit entry in the root's ld.so cache, as its own ldconfig reads it."""
    cache = root / "etc" / "ld.so.cache"
    if not cache.is_file():
        return []
    try:
        out = subprocess.run(
            ["ldconfig", "-p", "-C", str(cache)], capture_output=True, text=True, check=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    entries = []
    for line in out.splitlines():
        if (match := _LDCONFIG_LINE.match(line)) and ("64" in match.group(2) or "AArch64" in match.group(2)):
            entries.append((match.group(1), match.group(3)))
    return entries


def _candidates(root: Path, cache: Iterable[tuple[str, str]]) -> list[str]:
    """Container paths that may be driver libraries or links to them: the cache's, then the directories'."""
    paths = [path for _, path in cache]
    dirs = {str(PurePosixPath(p).parent) for p in paths} | set(LIBRARY_DIRS)
    for directory in sorted(dirs):
        for sub in (directory, f"{directory}/vdpau"):
            real = root / sub.lstrip("/")
            if real.is_dir():
                paths += [f"{sub}/{entry.name}" for entry in sorted(real.iterdir())]
    return list(dict.fromkeys(paths))


def libraries(root: Path, version: str) -> tuple[tuple[HostFile, ...], tuple[HostFile, ...]]:
    """(the driver's libraries, their aliases): see the module's docstring."""
    suffix = f".so.{version}"
    libs: dict[str, HostFile] = {}
    links: dict[str, str] = {}  # alias container path -> the library's container path
    for path in _candidates(root, _ld_cache(root)):
        real = resolve_in_root(root, path)
        if real is None or not real.endswith(suffix) or not (root / real.lstrip("/")).is_file():
            continue
        libs.setdefault(real, HostFile(host_path(root, real), real))
        if path != real:
            links[path] = real
    for lib in list(libs):
        name = PurePosixPath(lib).name
        if name.startswith("libcuda.so."):  # the toolkit links libcuda.so to it (create-symlinks)
            links.setdefault(str(PurePosixPath(lib).with_name("libcuda.so")), lib)
    aliases = tuple(HostFile(libs[target].host, alias) for alias, target in sorted(links.items()))
    return tuple(sorted(libs.values(), key=lambda f: f.container)), aliases


def _existing(root: Path, paths: Iterable[str]) -> tuple[HostFile, ...]:
    out = []
    for path in paths:
        real = resolve_in_root(root, path)
        if real is not None:
            out.append(HostFile(host_path(root, real), path))
    return tuple(out)


def discover(root: Path = Path("/"), *, nvml: NvmlView | None = None) -> DriverInstall:
    """The driver installation under `root`; NoDriver when there is none to give a container."""
    version = driver_version(root, nvml.version if nvml else None)
    gpus = nvml.gpus if nvml and nvml.gpus else gpus_from_nodes(root)
    if not gpus:
        raise NoDriver(f"driver {version} is loaded but {root / 'dev'} has no /dev/nvidiaN: no GPU to give")
    libs, aliases = libraries(root, version)
    if not any(PurePosixPath(lib.container).name.startswith("libcuda.so.") for lib in libs):
        raise NoDriver(
            f"the kernel module is {version} but no libcuda.so.{version} is under {root}: "
            "the driver's user-space libraries are missing or of another version"
        )
    binaries = [
        next((f"{d}/{name}" for d in BINARY_DIRS if resolve_in_root(root, f"{d}/{name}")), "")
        for name in BINARIES
    ]
    firmware = f"/lib/firmware/nvidia/{version}"
    return DriverInstall(
        root=root,
        version=version,
        gpus=gpus,
        control_nodes=tuple(f"/dev/{n}" for n in CONTROL_NODES if (root / "dev" / n).exists()),
        libraries=libs,
        aliases=aliases,
        binaries=_existing(root, [b for b in binaries if b]),
        sockets=_existing(root, SOCKETS),
        firmware=_existing(root, [firmware]),
        drm=tuple(drm_nodes(root, gpu.pci_bus_id) for gpu in gpus),
    )


@dataclass(frozen=True)
class NvmlView:
    """What NVML says about the driver and its GPUs (minion/gpu/nvml.py reads it)."""

    version: str
    gpus: tuple[Gpu, ...]
