"""A local directory (or one file) as an object's manifest and chunks (contracts/data_objects.py): what the
CLI uploads, what the control plane stores after reading a remote source, and what a minion uploads of a
worker's /opt/ml/output: one chunking rule for all three, so a digest means the same bytes everywhere.

Only regular files are taken. Symbolic links, sockets and devices are left out and counted, never followed:
a link in a downloaded archive or a user's directory could name anything on the machine that reads it."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from contracts.data_objects import CHUNK_BYTES, MAX_FILES, Manifest, ObjectFile, check_relative
from contracts.errors import InvalidInput


@dataclass(frozen=True)
class Piece:
    """Where one chunk's bytes are on this machine."""

    path: Path
    offset: int
    length: int

    def read(self) -> bytes:
        with self.path.open("rb") as fh:
            fh.seek(self.offset)
            return fh.read(self.length)


@dataclass
class Tree:
    manifest: Manifest
    pieces: dict[str, Piece] = field(default_factory=dict)  # chunk SHA-256 → where its bytes are
    skipped: int = 0  # links and special files left out


Skip = Callable[[str], bool]  # told a relative path (of a file or a directory): leave it out?


def _files(root: Path, skip: Skip | None) -> Iterator[tuple[str, Path]]:
    if root.is_file():
        yield root.name, root
        return
    for directory, dirs, files in os.walk(root):
        here = Path(directory)
        dirs[:] = sorted(d for d in dirs if skip is None or not skip((here / d).relative_to(root).as_posix()))
        for name in sorted(files):
            relative = (here / name).relative_to(root).as_posix()
            if skip is None or not skip(relative):
                yield relative, here / name


def scan(root: Path, skip: Skip | None = None) -> Tree:
    """The manifest of `root` (a directory, or a single file named by its own name) and where each of its
    chunks is. `skip`: which relative paths (files, and directories with all they hold) are left out."""
    if not root.exists():
        raise InvalidInput(
            f"{root} does not exist: give a file or a directory to upload", code="invalid_source"
        )
    files: list[ObjectFile] = []
    pieces: dict[str, Piece] = {}
    skipped = 0
    for relative, full in _files(root, skip):
        st = os.lstat(full)
        if not stat.S_ISREG(st.st_mode):
            skipped += 1
            continue
        check_relative(relative)
        chunks: list[str] = []
        with full.open("rb") as fh:
            offset = 0
            while data := fh.read(CHUNK_BYTES):
                sha = hashlib.sha256(data).hexdigest()
                chunks.append(sha)
                pieces.setdefault(sha, Piece(full, offset, len(data)))
                offset += len(data)
        files.append(ObjectFile(path=relative, size=offset, mode=stat.S_IMODE(st.st_mode), chunks=chunks))
        if len(files) > MAX_FILES:
            raise InvalidInput(
                f"{root} has more than {MAX_FILES} files: pack it as an archive", code="too_big"
            )
    files.sort(key=lambda f: f.path)
    return Tree(Manifest(files=files), pieces, skipped)
