"""The Unified Kernel Image: systemd-stub + kernel + initramfs + command line + os-release, joined by
objcopy (ukify is not in bookworm). systemd-stub measures these sections into PCR 11 at boot."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from image_builder import pe
from image_builder.errors import BuildError

STUB = Path("/usr/lib/systemd/boot/efi/linuxx64.efi.stub")
SYSTEMD_BOOT = Path("/usr/lib/systemd/boot/efi/systemd-bootx64.efi")


@dataclass(frozen=True)
class UkiParts:
    kernel: Path
    initrd: Path
    cmdline: Path
    osrel: Path


def _align(n: int, a: int = 0x10000) -> int:
    return (n + a - 1) // a * a


def build(parts: UkiParts, out: Path, epoch: int, stub: Path = STUB) -> Path:
    """Place each section after the stub's own (sizes decide the addresses, so a larger initramfs never
    overlaps the kernel), then pin the PE timestamp objcopy writes so the UKI is byte-reproducible."""
    if not stub.exists():
        raise BuildError(f"{stub} is missing; install systemd-boot-efi.")
    stub_bytes = stub.read_bytes()
    hdr = pe.parse(stub_bytes)
    vma = _align(max(va + vs for _n, va, vs, _p, _s in hdr.sections))
    argv = ["objcopy"]
    for name, path in (
        (".osrel", parts.osrel),
        (".cmdline", parts.cmdline),
        (".initrd", parts.initrd),
        (".linux", parts.kernel),
    ):
        argv += ["--add-section", f"{name}={path}", "--change-section-vma", f"{name}={vma:#x}"]
        vma = _align(vma + path.stat().st_size)
    argv += [str(stub), str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise BuildError(f"objcopy could not assemble the UKI: {proc.stderr.strip()}")
    data = bytearray(out.read_bytes())
    pe.pin_timestamp(data, epoch)
    out.write_bytes(bytes(data))
    return out
