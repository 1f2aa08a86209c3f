"""A Jetson's GPU as the NVIDIA Container Toolkit's CSV mode gives it (`nvidia-ctk cdi generate --mode=csv`),
without the toolkit: L4T lists what a container needs in
/etc/nvidia-container-runtime/host-files-for-container.d/*.csv, one `TYPE, PATH` a line:

- `dev`: device nodes (globs: /dev/nvhost-*, /dev/dri/card*), given to the container's devices "0" and "all";
- `lib` and `dir`: files and directories mounted read-only at the same path (a link is followed inside the
  root and its target mounted at both places);
- `sym`: links the toolkit's create-symlinks hook remakes in the container; here the link's target is
  mounted at the link's path instead (a node has no nvidia-cdi-hook);
- libcuda.so.X.Y also at libcuda.so.X and libcuda.so (the toolkit's hook and update-ldcache make those),
  and LD_LIBRARY_PATH names the libraries' directories outside the system's search path (update-ldcache's
  job).

Entries absent from the root are skipped, as the toolkit skips them: one CSV serves every L4T board."""

from __future__ import annotations

import re
import stat
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import Final

from minion.gpu.driver import HostFile, NoDriver, host_path, resolve_in_root

CSV_DIR: Final = "etc/nvidia-container-runtime/host-files-for-container.d"
SYSTEM_LIBRARY_DIRS: Final = frozenset(
    {"/lib", "/usr/lib", "/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/lib64", "/usr/lib64"}
)
_LIBCUDA: Final = re.compile(r"^libcuda\.so\.(\d+)\.\d+")


class EntryType(StrEnum):
    DEV = "dev"
    LIB = "lib"
    SYM = "sym"
    DIR = "dir"


@dataclass(frozen=True)
class Entry:
    type: EntryType
    path: str


@dataclass(frozen=True)
class CsvInstall:
    """What the CSV files of a root give a container: its device nodes and its mounts."""

    root: Path
    files: tuple[Path, ...]
    device_nodes: tuple[HostFile, ...]
    mounts: tuple[HostFile, ...]
    library_path: tuple[str, ...]  # directories the dynamic linker must search, in the order found


def csv_files(root: Path) -> tuple[Path, ...]:
    directory = root / CSV_DIR
    return tuple(sorted(directory.glob("*.csv"))) if directory.is_dir() else ()


def parse(path: Path) -> list[Entry]:
    """The entries of one CSV file; NoDriver names the file and line of the first that is not one."""
    entries = []
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        kind, _, where = (part.strip() for part in line.partition(","))
        if kind not in EntryType.__members__.values() or not where.startswith("/"):
            raise NoDriver(
                f"{path}:{number}: {line!r} is not `TYPE, /PATH` with TYPE one of "
                f"{', '.join(t.value for t in EntryType)}: fix or remove the line"
            )
        entries.append(Entry(EntryType(kind), where))
    return entries


def _glob(root: Path, pattern: str) -> list[str]:
    if not any(ch in pattern for ch in "*?["):
        return [pattern]
    return sorted("/" + str(p.relative_to(root)) for p in root.glob(pattern.lstrip("/")))


def _is_char_device(path: Path) -> bool:
    try:
        return stat.S_ISCHR(path.stat().st_mode)
    except OSError:
        return False


def _mounts_of(entry: Entry, path: str, real: str, host: str) -> list[HostFile]:
    """A lib, dir or sym entry's mounts: its target at the target's path and at the entry's, and for
    libcuda also at the soname and dev name update-ldcache and create-symlinks would make."""
    mounts = [HostFile(host, real), HostFile(host, path)]
    if entry.type is EntryType.LIB and (match := _LIBCUDA.match(PurePosixPath(real).name)):
        for alias in (f"libcuda.so.{match.group(1)}", "libcuda.so"):
            mounts.append(HostFile(host, str(PurePosixPath(path).with_name(alias))))
    return mounts


def discover(root: Path = Path("/")) -> CsvInstall:
    """The root's CSV-mode GPU; NoDriver when it has no CSV files or they give no device node."""
    files = csv_files(root)
    if not files:
        raise NoDriver(f"no CSV files in {root / CSV_DIR}: this is not an L4T (Jetson) installation")
    nodes: dict[str, HostFile] = {}
    mounts: dict[str, HostFile] = {}
    library_path: dict[str, None] = {}
    for entry in (e for f in files for e in parse(f)):
        for path in _glob(root, entry.path):
            real = resolve_in_root(root, path)
            if real is None:
                continue
            host = host_path(root, real)
            if entry.type is EntryType.DEV:
                if _is_char_device(Path(host)):
                    nodes.setdefault(path, HostFile(host, path))
                continue
            for mount in _mounts_of(entry, path, real, host):
                mounts.setdefault(mount.container, mount)
            if (
                entry.type is EntryType.LIB
                and (folder := str(PurePosixPath(path).parent)) not in SYSTEM_LIBRARY_DIRS
            ):
                library_path[folder] = None
    if not nodes:
        raise NoDriver(f"the CSV files in {root / CSV_DIR} name no device node that {root / 'dev'} has")
    return CsvInstall(
        root=root,
        files=files,
        device_nodes=tuple(nodes.values()),
        mounts=tuple(mounts.values()),
        library_path=tuple(library_path),
    )
