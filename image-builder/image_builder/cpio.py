"""A reproducible newc cpio writer for the initramfs: fixed order, owners, mtimes and inode numbers
(the cpio tool would record whatever the build host's files say)."""

from __future__ import annotations

import stat
from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    path: str  # without leading slash
    mode: int  # full st_mode (type + permissions)
    data: bytes = b""  # file contents, or the link target for symlinks


def _pad(n: int) -> bytes:
    return b"\0" * ((4 - n % 4) % 4)


def _record(ino: int, entry: Entry, mtime: int) -> bytes:
    name = entry.path.encode() + b"\0"
    nlink = 2 if stat.S_ISDIR(entry.mode) else 1
    fields = (ino, entry.mode, 0, 0, nlink, mtime, len(entry.data), 0, 0, 0, 0, len(name), 0)
    head = b"070701" + b"".join(b"%08X" % f for f in fields)
    return head + name + _pad(len(head) + len(name)) + entry.data + _pad(len(entry.data))


def archive(entries: list[Entry], mtime: int) -> bytes:
    """Entries sorted by path (parents before children), then the trailer."""
    out = bytearray()
    for ino, entry in enumerate(sorted(entries, key=lambda e: e.path), start=1):
        out += _record(ino, entry, mtime)
    out += _record(0, Entry("TRAILER!!!", 0), 0)
    return bytes(out)
