"""The staging tree: the cached base tree hard-linked (seconds, not a copy), plus rigbase's own files.

Hard links share inodes with the cache, so every file written here replaces its path (unlink, then write)
instead of writing through the link into the cache."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from image_builder.errors import BuildError


def link_tree(src: Path, dst: Path) -> int:
    """Recreate `src` under `dst` in sorted order (directory creation order decides mke2fs -d's inode
    order), hard-linking regular files. Returns the number of entries."""
    if dst.exists():
        shutil.rmtree(dst)
    count = 0

    def walk(s: Path, d: Path) -> None:
        nonlocal count
        st = os.lstat(s)
        os.mkdir(d, stat.S_IMODE(st.st_mode))
        os.chown(d, st.st_uid, st.st_gid)
        os.chmod(d, stat.S_IMODE(st.st_mode))
        for name in sorted(os.listdir(s)):
            sp, dp = s / name, d / name
            lst = os.lstat(sp)
            count += 1
            if stat.S_ISDIR(lst.st_mode):
                walk(sp, dp)
            elif stat.S_ISLNK(lst.st_mode):
                os.symlink(os.readlink(sp), dp)
                os.lchown(dp, lst.st_uid, lst.st_gid)
            elif stat.S_ISREG(lst.st_mode):
                os.link(sp, dp)
            elif stat.S_ISCHR(lst.st_mode) or stat.S_ISBLK(lst.st_mode) or stat.S_ISFIFO(lst.st_mode):
                os.mknod(dp, lst.st_mode, lst.st_rdev)
                os.chown(dp, lst.st_uid, lst.st_gid)
            # sockets are skipped: they mean nothing in an image

    walk(src, dst)
    return count


def put(root: Path, rel: str, data: bytes | str, mode: int = 0o644) -> Path:
    """Write a file into the staging tree without touching a hard-linked cache file."""
    path = root / rel.lstrip("/")
    if not str(path.resolve().parent).startswith(str(root.resolve())):
        raise BuildError(f"refusing to write {rel} outside the staging tree.")
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        path.unlink()
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    os.chmod(path, mode)
    return path


def link(root: Path, rel: str, target: str) -> None:
    path = root / rel.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        path.unlink()
    os.symlink(target, path)
