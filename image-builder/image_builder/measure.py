"""Expected TPM measurements: PCR 11 per boot phase (systemd-measure), PCR 12, and the PE/Authenticode
digests behind PCR 4 with a replay of the firmware's TCG event log (what a verifier does)."""

from __future__ import annotations

import hashlib
import json
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

from image_builder.errors import BuildError

SYSTEMD_MEASURE = Path("/usr/lib/systemd/systemd-measure")

#: The boot phases this boot goes through, as the words systemd-pcrphase extends into PCR 11 after the
#: stub's section measurements. Our initramfs is not systemd, so there is no enter-initrd/leave-initrd;
#: in the real root systemd-pcrphase-sysinit.service measures "sysinit" and systemd-pcrphase.service
#: "ready". The empty phase is the value right after the stub (what the initramfs sees).
PHASES: tuple[str, ...] = ("", "sysinit", "sysinit:ready")

EV_SEPARATOR = 0x4
EV_NO_ACTION = 0x3
EV_EFI_BOOT_SERVICES_APPLICATION = 0x80000003
EV_EFI_ACTION = 0x80000007
ALG_SHA256 = 0x000B
CALLING_EFI_APP = b"Calling EFI Application from Boot Option"


def extend(pcr: bytes, digest: bytes) -> bytes:
    return hashlib.sha256(pcr + digest).digest()


def pcr11(sections: dict[str, Path], phases: tuple[str, ...] = PHASES) -> dict[str, str]:
    """phase → expected sha256 PCR 11, via systemd-measure (one call per phase: its JSON lists the
    phases it computed)."""
    if not SYSTEMD_MEASURE.exists():
        raise BuildError(
            f"{SYSTEMD_MEASURE} is missing; install systemd (bookworm ships systemd-measure there)."
        )
    args = [f"--{name.lstrip('.')}={path}" for name, path in sections.items()]
    out: dict[str, str] = {}
    for phase in phases:
        proc = subprocess.run(
            [str(SYSTEMD_MEASURE), "calculate", "--bank=sha256", "--json=short", f"--phase={phase}", *args],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise BuildError(f"systemd-measure failed: {proc.stderr.strip()}")
        entries = json.loads(proc.stdout)["sha256"]
        out[phase] = entries[0]["hash"]
    return out


def pcr11_python(sections: dict[str, bytes], phase: str) -> str:
    """The same computation in Python (systemd-stub's rule: for each section, extend sha256(name\\0) then
    sha256(contents); then each phase word). Used to check systemd-measure and for modified UKIs."""
    pcr = b"\0" * 32
    for name, data in sections.items():
        pcr = extend(pcr, hashlib.sha256(name.encode() + b"\0").digest())
        pcr = extend(pcr, hashlib.sha256(data).digest())
    for word in filter(None, phase.split(":")):
        pcr = extend(pcr, hashlib.sha256(word.encode()).digest())
    return pcr.hex()


def cmdline_digest(cmdline: str) -> bytes:
    """How systemd measures a command line: UTF-16LE with its NUL terminator."""
    return hashlib.sha256(cmdline.encode("utf-16-le") + b"\0\0").digest()


def pcr12(cmdline: str) -> str:
    """Seen on the boot test's event log: systemd-boot 252 passes a type #2 entry's .cmdline to the UKI as
    load options and measures them into PCR 12, and systemd-stub measures the loader-provided command line
    again. Any other value means the command line was edited at the boot menu."""
    pcr = b"\0" * 32
    for _ in range(2):
        pcr = extend(pcr, cmdline_digest(cmdline))
    return pcr.hex()


def pcr4_for_path(app_digests: list[str]) -> str:
    """PCR 4 as OVMF/UEFI firmware builds it for one boot path: the boot-option action, the separator,
    then each PE image it loaded (by Authenticode digest), in order."""
    pcr = b"\0" * 32
    pcr = extend(pcr, hashlib.sha256(CALLING_EFI_APP).digest())
    pcr = extend(pcr, hashlib.sha256(b"\0\0\0\0").digest())
    for d in app_digests:
        pcr = extend(pcr, bytes.fromhex(d))
    return pcr.hex()


@dataclass(frozen=True)
class Event:
    pcr: int
    type: int
    sha256: bytes | None
    data: bytes


def parse_event_log(blob: bytes) -> list[Event]:
    """TCG PC Client crypto-agile event log (binary_bios_measurements): a SHA-1-format header event
    (TCG_EfiSpecIdEvent giving the digest sizes), then TCG_PCR_EVENT2 records."""
    if len(blob) < 32:
        raise ValueError("event log too short")
    pcr, etype = struct.unpack_from("<II", blob, 0)
    (size,) = struct.unpack_from("<I", blob, 28)
    spec = blob[32 : 32 + size]
    if not spec.startswith(b"Spec ID Event03"):
        raise ValueError("not a crypto-agile event log")
    (nalg,) = struct.unpack_from("<I", spec, 24)
    sizes = {}
    for i in range(nalg):
        alg, dsize = struct.unpack_from("<HH", spec, 28 + 4 * i)
        sizes[alg] = dsize
    off = 32 + size
    events: list[Event] = []
    while off + 12 <= len(blob):
        pcr, etype, count = struct.unpack_from("<III", blob, off)
        off += 12
        sha256 = None
        for _ in range(count):
            (alg,) = struct.unpack_from("<H", blob, off)
            off += 2
            if alg not in sizes:
                raise ValueError(f"unknown digest algorithm {alg:#x} in the event log")
            if alg == ALG_SHA256:
                sha256 = blob[off : off + sizes[alg]]
            off += sizes[alg]
        (esize,) = struct.unpack_from("<I", blob, off)
        off += 4
        events.append(Event(pcr, etype, sha256, blob[off : off + esize]))
        off += esize
    return events


def replay(events: list[Event], index: int) -> str:
    pcr = b"\0" * 32
    for e in events:
        if e.pcr == index and e.type != EV_NO_ACTION and e.sha256 is not None:
            pcr = extend(pcr, e.sha256)
    return pcr.hex()


@dataclass(frozen=True)
class Pcr4Check:
    ok: bool
    replayed: str
    loaded_images: list[str]
    reason: str


def check_pcr4(events: list[Event], pcr4_value: str, known_images: dict[str, str]) -> Pcr4Check:
    """A verifier's PCR 4 check: the log must replay to the PCR value the TPM reports, and every PE image
    the firmware loaded must be one the manifest names (systemd-boot, the UKI, the kernel)."""
    replayed = replay(events, 4)
    loaded = [
        e.sha256.hex()
        for e in events
        if e.pcr == 4 and e.type == EV_EFI_BOOT_SERVICES_APPLICATION and e.sha256
    ]
    names = {v: k for k, v in known_images.items()}
    if replayed != pcr4_value.lower():
        return Pcr4Check(False, replayed, loaded, "the event log does not replay to the reported PCR 4")
    unknown = [d for d in loaded if d not in names]
    if unknown:
        return Pcr4Check(False, replayed, loaded, f"PE images not in the manifest were loaded: {unknown}")
    if not loaded:
        return Pcr4Check(False, replayed, loaded, "no boot application measured into PCR 4")
    return Pcr4Check(True, replayed, [names[d] for d in loaded], "ok")
