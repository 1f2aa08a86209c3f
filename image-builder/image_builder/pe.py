"""PE/COFF helpers: the Authenticode digest firmware measures into PCR 4, and pinning the timestamp."""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass


@dataclass(frozen=True)
class PEHeader:
    pe_offset: int
    opt_offset: int
    is_pe32_plus: bool
    checksum_offset: int
    cert_dir_offset: int
    size_of_headers: int
    sections: list[tuple[str, int, int, int, int]]  # name, vaddr, vsize, raw_ptr, raw_size


def parse(data: bytes) -> PEHeader:
    if data[:2] != b"MZ":
        raise ValueError("not a PE image (no MZ header)")
    pe = struct.unpack_from("<I", data, 0x3C)[0]
    if data[pe : pe + 4] != b"PE\0\0":
        raise ValueError("not a PE image (no PE signature)")
    (nsections,) = struct.unpack_from("<H", data, pe + 6)
    (opt_size,) = struct.unpack_from("<H", data, pe + 20)
    opt = pe + 24
    (magic,) = struct.unpack_from("<H", data, opt)
    plus = magic == 0x20B
    # Data directory 4 (certificate table) sits at 128 (PE32) or 144 (PE32+) bytes into the optional header.
    cert_dir = opt + (144 if plus else 128)
    (size_of_headers,) = struct.unpack_from("<I", data, opt + 60)
    sections = []
    sec = opt + opt_size
    for i in range(nsections):
        off = sec + 40 * i
        name = data[off : off + 8].rstrip(b"\0").decode("ascii", "replace")
        vsize, vaddr, raw_size, raw_ptr = struct.unpack_from("<IIII", data, off + 8)
        sections.append((name, vaddr, vsize, raw_ptr, raw_size))
    return PEHeader(pe, opt, plus, opt + 64, cert_dir, size_of_headers, sections)


def authenticode_sha256(data: bytes) -> str:
    """The PE image hash of the Authenticode spec (what UEFI LoadImage measures as
    EV_EFI_BOOT_SERVICES_APPLICATION): headers without CheckSum and the certificate-table entry,
    sections in file order, then trailing data except the certificate table itself."""
    h = parse(data)
    cert_off, cert_size = struct.unpack_from("<II", data, h.cert_dir_offset)
    md = hashlib.sha256()
    md.update(data[: h.checksum_offset])
    md.update(data[h.checksum_offset + 4 : h.cert_dir_offset])
    md.update(data[h.cert_dir_offset + 8 : h.size_of_headers])
    hashed = h.size_of_headers
    for _name, _va, _vs, ptr, size in sorted(h.sections, key=lambda s: s[3]):
        if size == 0:
            continue
        md.update(data[ptr : ptr + size])
        hashed = max(hashed, ptr + size)
    end = len(data) - (cert_size if cert_off else 0)
    if end > hashed:
        md.update(data[hashed:end])
    return md.hexdigest()


def pin_timestamp(data: bytearray, epoch: int) -> None:
    """Set the COFF TimeDateStamp (objcopy writes the current time) and recompute the PE checksum."""
    h = parse(bytes(data))
    struct.pack_into("<I", data, h.pe_offset + 8, epoch & 0xFFFFFFFF)
    struct.pack_into("<I", data, h.checksum_offset, 0)
    struct.pack_into("<I", data, h.checksum_offset, pe_checksum(bytes(data), h.checksum_offset))


def pe_checksum(data: bytes, checksum_offset: int) -> int:
    total = 0
    padded = data + b"\0" * (len(data) % 2)
    for i, (word,) in enumerate(struct.iter_unpack("<H", padded)):
        if i * 2 in (checksum_offset, checksum_offset + 2):
            continue
        total += word
        total = (total & 0xFFFF) + (total >> 16)
    return (total & 0xFFFF) + len(data)


def section(data: bytes, name: str) -> bytes:
    """Raw bytes of one section, trimmed to its virtual size (how systemd-stub measures it)."""
    for sname, _va, vsize, ptr, size in parse(data).sections:
        if sname == name:
            return data[ptr : ptr + min(vsize, size)]
    raise KeyError(name)
