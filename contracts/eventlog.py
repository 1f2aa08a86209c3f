"""The firmware's TCG event log and what a verifier does with it (docs/join-protocol.md, "Boot path (PCR 4)").

The log (/sys/kernel/security/tpm0/binary_bios_measurements) is in the TCG PC Client crypto-agile format:
a SHA-1-format header event (TCG_EfiSpecIdEvent, giving each bank's digest size) then TCG_PCR_EVENT2
records. Replaying the sha256 digests logged for a PCR gives the value the TPM must hold; for PCR 4 the
EV_EFI_BOOT_SERVICES_APPLICATION digests are the Authenticode digests of the PE images the firmware ran
(systemd-boot, the UKI, the kernel), which the image manifest lists as `pe_hashes`.

Shared by the image builder (image_builder.measure, checking a VM boot) and the control plane (the join
and continuous-attestation verifier), so both read the log the same way. Standard library only. The log
comes from the node, so the parser trusts nothing in it: every length is checked against the bytes there.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

EV_NO_ACTION: Final = 0x3
EV_SEPARATOR: Final = 0x4
EV_EFI_BOOT_SERVICES_APPLICATION: Final = 0x80000003
EV_EFI_ACTION: Final = 0x80000007
ALG_SHA1: Final = 0x0004
ALG_SHA256: Final = 0x000B
SPEC_ID_SIGNATURE: Final = b"Spec ID Event03\0"
BOOT_PCR: Final = 4
# A real firmware log is tens of KiB (OVMF: ~30 KiB); servers with many option ROMs a few hundred at most.
MAX_EVENT_LOG_BYTES: Final = 256 * 1024
_HEADER = struct.Struct("<II20sI")  # TCG_PCClientPCREvent: pcrIndex, eventType, SHA-1 digest, eventDataSize


class EventLogError(ValueError):
    """The bytes are not a crypto-agile TCG event log (the message says where it went wrong)."""


def extend(pcr: bytes, digest: bytes) -> bytes:
    return hashlib.sha256(pcr + digest).digest()


@dataclass(frozen=True)
class Event:
    pcr: int
    type: int
    sha256: bytes | None
    data: bytes


def _take(blob: bytes, fmt: str, off: int, what: str) -> tuple[int, ...]:
    try:
        return struct.unpack_from(fmt, blob, off)
    except struct.error:
        raise EventLogError(f"the event log ends inside {what} at byte {off}") from None


def parse_event_log(blob: bytes) -> list[Event]:  # noqa: C901
    """Every TCG_PCR_EVENT2 record of a crypto-agile log, in order. EventLogError when it is not one."""
    if len(blob) > MAX_EVENT_LOG_BYTES:
        raise EventLogError(f"the event log is {len(blob)} bytes, more than {MAX_EVENT_LOG_BYTES}")
    if len(blob) < _HEADER.size:
        raise EventLogError("the event log is too short for its header event")
    _, _, _, size = _HEADER.unpack_from(blob, 0)
    spec = blob[_HEADER.size : _HEADER.size + size]
    if len(spec) != size or not spec.startswith(SPEC_ID_SIGNATURE[:15]):
        raise EventLogError("not a crypto-agile event log (no Spec ID Event03 header)")
    (nalg,) = _take(spec, "<I", 24, "the Spec ID event")
    sizes: dict[int, int] = {}
    for i in range(nalg):
        alg, dsize = _take(spec, "<HH", 28 + 4 * i, "the Spec ID event's digest sizes")
        sizes[alg] = dsize
    if sizes.get(ALG_SHA256) != 32:
        raise EventLogError("the event log has no sha256 bank")
    off = _HEADER.size + size
    events: list[Event] = []
    while off < len(blob):
        start = off
        pcr, etype, count = _take(blob, "<III", off, "an event header")
        off += 12
        if count > len(sizes):
            raise EventLogError(
                f"event at byte {start} claims {count} digests, the log has {len(sizes)} banks"
            )
        sha256 = None
        for _ in range(count):
            (alg,) = _take(blob, "<H", off, "a digest")
            off += 2
            if alg not in sizes:
                raise EventLogError(f"unknown digest algorithm {alg:#x} in the event at byte {start}")
            if off + sizes[alg] > len(blob):
                raise EventLogError(f"the event log ends inside a digest at byte {off}")
            if alg == ALG_SHA256:
                sha256 = blob[off : off + sizes[alg]]
            off += sizes[alg]
        (esize,) = _take(blob, "<I", off, "an event's data size")
        off += 4
        if off + esize > len(blob):
            raise EventLogError(f"the event log ends inside the data of the event at byte {start}")
        events.append(Event(pcr, etype, sha256, blob[off : off + esize]))
        off += esize
    return events


def replay(events: Sequence[Event], index: int) -> str:
    """The sha256 PCR `index` the logged events add up to (hex), from all zeros."""
    pcr = b"\0" * 32
    for e in events:
        if e.pcr == index and e.type != EV_NO_ACTION and e.sha256 is not None:
            pcr = extend(pcr, e.sha256)
    return pcr.hex()


def boot_applications(events: Sequence[Event]) -> list[str]:
    """The Authenticode digests (hex) of the PE images the firmware ran, in order (PCR 4)."""
    return [
        e.sha256.hex()
        for e in events
        if e.pcr == BOOT_PCR and e.type == EV_EFI_BOOT_SERVICES_APPLICATION and e.sha256
    ]


@dataclass(frozen=True)
class Pcr4Check:
    ok: bool
    replayed: str
    loaded_images: list[str]
    reason: str


def check_pcr4(events: Sequence[Event], pcr4_value: str, known_images: Mapping[str, str]) -> Pcr4Check:
    """A verifier's PCR 4 check: the log must replay to the PCR value the TPM reports, and every PE image
    the firmware loaded must be one the manifest names (`known_images`: name → digest, its pe_hashes).
    On success `loaded_images` are the names, in load order; otherwise the digests."""
    replayed = replay(events, BOOT_PCR)
    loaded = boot_applications(events)
    names = {v.lower(): k for k, v in known_images.items()}
    if replayed != pcr4_value.lower():
        return Pcr4Check(False, replayed, loaded, "the event log does not replay to the reported PCR 4")
    unknown = [d for d in loaded if d not in names]
    if unknown:
        return Pcr4Check(False, replayed, loaded, f"PE images not in the manifest were loaded: {unknown}")
    if not loaded:
        return Pcr4Check(False, replayed, loaded, "no boot application measured into PCR 4")
    return Pcr4Check(True, replayed, [names[d] for d in loaded], "ok")
