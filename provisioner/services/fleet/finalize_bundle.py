"""The playbook bundle minions download to finalize themselves (docs/join-protocol.md, "Finalize").

A gzip'd tar of the settings' playbook directory (Settings.playbooks) that is the same bytes on every
control plane with the same playbooks: entries sorted, every mtime 0, owner root, modes 0755/0644 by the
executable bit, no gzip file name or time, no Python caches. So its SHA-256 — part of every node's
finalize generation — only changes when a playbook does, and two API processes serve the same digest.
Built once per process (the playbooks ship with the control plane and do not change under it)."""

from __future__ import annotations

import functools
import gzip
import hashlib
import io
import stat
import tarfile
from dataclasses import dataclass
from pathlib import Path

from contracts.errors import InvalidInput, NotFound, Unavailable
from contracts.finalize import BUNDLE_MAX_BYTES
from provisioner.domain.text import printable

SKIPPED_NAMES = frozenset({"__pycache__", ".pytest_cache", ".git"})
SKIPPED_SUFFIXES = (".pyc", ".pyo", ".retry")


@dataclass(frozen=True)
class Bundle:
    digest: str  # SHA-256 of `data`, lowercase hex
    data: bytes


def _entries(root: Path) -> list[Path]:
    """Every directory and file under `root` the bundle keeps, sorted by relative path."""
    kept: list[Path] = []
    for path in sorted(root.rglob("*"), key=lambda p: p.relative_to(root).as_posix()):
        rel = path.relative_to(root)
        if any(part in SKIPPED_NAMES for part in rel.parts) or path.name.endswith(SKIPPED_SUFFIXES):
            continue
        mode = path.lstat().st_mode
        if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
            raise InvalidInput(
                f"{path} in the playbook directory is not a plain file or directory: "
                "replace it with a copy (RIGBASE_PLAYBOOKS)"
            )
        kept.append(path)
    return kept


def _tar_info(root: Path, path: Path) -> tarfile.TarInfo:
    info = tarfile.TarInfo(path.relative_to(root).as_posix())
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    st = path.stat()
    if path.is_dir():
        info.type = tarfile.DIRTYPE
        info.mode = 0o755
    else:
        info.size = st.st_size
        info.mode = 0o755 if st.st_mode & stat.S_IXUSR else 0o644
    return info


def build(root: Path) -> Bundle:
    """The bundle of the playbook directory `root` (not cached: see `bundle_for`)."""
    if not root.is_dir():
        raise Unavailable(
            f"the finalize playbook directory {root} does not exist: set RIGBASE_PLAYBOOKS to the "
            "playbooks/ directory of this release"
        )
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in _entries(root):
            info = _tar_info(root, path)
            if info.isdir():
                tar.addfile(info)
            else:
                with path.open("rb") as fh:
                    tar.addfile(info, fh)
    packed = io.BytesIO()
    # mtime=0 and no file name in the gzip header: the same playbooks give the same bytes
    with gzip.GzipFile(filename="", mode="wb", fileobj=packed, mtime=0, compresslevel=9) as gz:
        gz.write(raw.getvalue())
    data = packed.getvalue()
    if len(data) > BUNDLE_MAX_BYTES:
        raise Unavailable(
            f"the playbook bundle of {root} is {len(data)} bytes, more than minions accept "
            f"({BUNDLE_MAX_BYTES}): keep only playbooks and roles in RIGBASE_PLAYBOOKS"
        )
    return Bundle(hashlib.sha256(data).hexdigest(), data)


@functools.cache
def _cached(root: Path) -> Bundle:
    return build(root)


@functools.cache
def _resolved(root: Path) -> Path:
    return root.resolve()


def bundle_for(root: Path) -> Bundle:
    """The bundle of `root`, built on first use in this process. Every heartbeat answer with finalize
    work asks for its digest: the path is resolved once too (a realpath is a syscall per component)."""
    return _cached(_resolved(root))


def by_digest(root: Path, digest: str) -> Bundle:
    """The bundle with this digest, or NotFound (a minion holding work from before an upgrade)."""
    bundle = bundle_for(root)
    if digest != bundle.digest:
        raise NotFound(
            f"no playbook bundle {printable(digest, 64)}: this control plane serves {bundle.digest}; "
            "take the finalize work from the next heartbeat answer",
            code="bundle_not_found",
        )
    return bundle
