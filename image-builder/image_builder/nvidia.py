"""The NVIDIA driver in the image (`--with-nvidia`): Debian's non-free driver at a pinned version, its
kernel modules compiled by DKMS at build time for the image's own kernel (docs/image-builder.md).

Why at build time: a node's root is a dm-verity image, so nothing can be compiled on it at boot. In the
build chroot `uname -r` is the build host's kernel, not the one the image boots. Debian's DKMS (3.0.10)
sees that it runs in a chroot and builds for the tree's kernel while debootstrap configures it; this step
does not rely on that: it asks DKMS for the image's kernel by name (`-k`), builds and installs only what
is missing, and refuses a tree whose modules are not there. The modules are built against the image's own
headers (`linux-headers-KVER` in the tree) and installed into `lib/modules/KVER/updates/dkms`; from there
they are part of the
verity root, so they are measured with it (the root hash is on the UKI's measured command line). Debian's
nouveau blacklist and udev rule (nvidia_helper makes `/dev/nvidia*`) come with the packages; a boot on a
GPU has not been seen here.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from image_builder.dpkg import package_versions
from image_builder.errors import BuildError

#: The driver the image carries: Debian bookworm non-free's nvidia-driver, pinned so two builds of one
#: commit carry the same driver. A mirror that moved on is refused (`check_pinned`).
DRIVER_VERSION: Final = "535.261.03-1"
# debootstrap resolves no virtual package: nvidia-kernel-dkms needs nvidia-kernel-support--v1, which
# nvidia-kernel-support provides, so it and what it brings are named (apt would have found them)
PACKAGES: Final = (
    "nvidia-driver",
    "nvidia-kernel-dkms",
    "nvidia-kernel-support",
    "nvidia-kernel-common",
    "nvidia-modprobe",
    "linux-headers-amd64",
)
COMPONENTS: Final = ("main", "contrib", "non-free", "non-free-firmware")
PINNED: Final = ("nvidia-driver", "nvidia-kernel-dkms")
DKMS_SOURCE: Final = re.compile(r"^(nvidia-current)-(\d+(?:\.\d+)+)$")  # /usr/src/NAME-VERSION

Runner = Callable[..., subprocess.CompletedProcess[str]]  # rootfs.chroot(root, *argv)


@dataclass(frozen=True)
class DriverFacts:
    """What the image's driver is: the manifest's `nvidia` entry."""

    version: str  # the Debian package version
    kernel: str  # the kernel its modules were built for
    modules: tuple[str, ...]  # paths below lib/modules/KERNEL

    def manifest(self) -> dict[str, object]:
        return {"driver": self.version, "kernel": self.kernel, "modules": list(self.modules)}


def check_pinned(root: Path, pinned: str = DRIVER_VERSION) -> str:
    """The installed driver's version, when it is the pinned one; else a BuildError saying what to do."""
    versions = package_versions(root)
    for name in PINNED:
        got = versions.get(name)
        if got is None:
            raise BuildError(f"{name} did not install: the mirror's non-free component must carry it")
        if got != pinned:
            raise BuildError(
                f"the mirror has {name} {got}, the build pins {pinned}: build from a mirror that carries "
                f"{pinned} (--mirror, e.g. a snapshot), or test {got} and move DRIVER_VERSION "
                "(image_builder/nvidia.py) to it"
            )
    return pinned


def image_kernel(root: Path) -> str:
    """The kernel the image boots: the tree's one kernel with its modules."""
    kernels = sorted(p.name for p in (root / "lib/modules").glob("*") if (p / "modules.dep").exists())
    if len(kernels) != 1:
        raise BuildError(f"the tree has kernels {kernels or 'none'}: exactly one must boot the image")
    return kernels[0]


def dkms_source(root: Path) -> tuple[str, str]:
    """(module name, version) of the driver's DKMS source in the tree."""
    for path in sorted((root / "usr/src").glob("nvidia-current-*")):
        if match := DKMS_SOURCE.match(path.name):
            return match.group(1), match.group(2)
    raise BuildError("nvidia-kernel-dkms left no source in /usr/src: its install failed, see debootstrap.log")


def built_modules(root: Path, kver: str) -> tuple[str, ...]:
    base = root / "lib/modules" / kver
    return tuple(sorted(str(p.relative_to(base)) for p in base.glob("updates/dkms/nvidia*.ko*")))


def compile_modules(root: Path, run: Runner, log: Callable[[str], None] = print) -> DriverFacts:
    """The driver's modules for the tree's kernel, built and installed with the tree's DKMS and headers
    where debootstrap's configure did not already."""
    version = check_pinned(root)
    kver = image_kernel(root)
    if not (root / "usr/src" / f"linux-headers-{kver}" / "Makefile").exists():
        raise BuildError(
            f"no headers for the image's kernel {kver} in the tree: linux-headers-amd64 must match "
            "linux-image-amd64 (one suite, one mirror)"
        )
    name, source = dkms_source(root)
    proc = root / "proc"
    subprocess.run(["mount", "-t", "proc", "proc", str(proc)], check=True)
    try:
        status = run(root, "dkms", "status", "-m", name, "-v", source, "-k", kver).stdout
        if "installed" not in status:
            log(f"compiling {name} {source} for the image's kernel {kver} (DKMS) ...")
            for step in ("build", "install"):
                try:
                    run(root, "dkms", step, "-m", name, "-v", source, "-k", kver)
                except subprocess.CalledProcessError as exc:
                    tail = " / ".join((exc.stdout or exc.stderr or "").strip().splitlines()[-3:])
                    raise BuildError(f"dkms {step} {name}/{source} for {kver} failed: {tail}") from None
    finally:
        subprocess.run(["umount", str(proc)], check=False)
    # the compiler's object files, whoever built them: a cache for the next build, never read on a node
    # (DKMS keeps its record of the installed modules beside it)
    shutil.rmtree(root / "var/lib/dkms" / name / source / "build", ignore_errors=True)
    modules = built_modules(root, kver)
    if not any(Path(m).name.startswith(f"{name}.ko") for m in modules):
        raise BuildError(f"dkms installed no {name} module for {kver}: see /var/lib/dkms in the tree")
    return DriverFacts(version, kver, modules)


def facts_of(root: Path) -> DriverFacts | None:
    """The driver the tree carries, read back from it; None without one."""
    versions = package_versions(root)
    if "nvidia-kernel-dkms" not in versions:
        return None
    kver = image_kernel(root)
    return DriverFacts(versions["nvidia-kernel-dkms"], kver, built_modules(root, kver))
