"""Expected TPM measurements: PCR 11 per boot phase (systemd-measure), PCR 12, and the PE/Authenticode
digests behind PCR 4 with a replay of the firmware's TCG event log (what a verifier does)."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

# The event log parser, replay and PCR 4 check live in the wire contract, shared with the control
# plane's verifier; re-exported here for the builder's callers (tests/image_builder/test_image_boot.py).
from contracts.eventlog import (
    ALG_SHA256,
    EV_EFI_ACTION,
    EV_EFI_BOOT_SERVICES_APPLICATION,
    EV_NO_ACTION,
    EV_SEPARATOR,
    Event,
    Pcr4Check,
    check_pcr4,
    extend,
    parse_event_log,
    replay,
)
from image_builder.errors import BuildError

__all__ = [
    "ALG_SHA256",
    "CALLING_EFI_APP",
    "EV_EFI_ACTION",
    "EV_EFI_BOOT_SERVICES_APPLICATION",
    "EV_NO_ACTION",
    "EV_SEPARATOR",
    "PHASES",
    "Event",
    "Pcr4Check",
    "check_pcr4",
    "cmdline_digest",
    "extend",
    "parse_event_log",
    "pcr4_for_path",
    "pcr11",
    "pcr11_python",
    "pcr12",
    "replay",
]

SYSTEMD_MEASURE = Path("/usr/lib/systemd/systemd-measure")

#: The boot phases this boot goes through, as the words systemd-pcrphase extends into PCR 11 after the
#: stub's section measurements. Our initramfs is not systemd, so there is no enter-initrd/leave-initrd;
#: in the real root systemd-pcrphase-sysinit.service measures "sysinit" and systemd-pcrphase.service
#: "ready". The empty phase is the value right after the stub (what the initramfs sees).
PHASES: tuple[str, ...] = ("", "sysinit", "sysinit:ready")

CALLING_EFI_APP = b"Calling EFI Application from Boot Option"


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
