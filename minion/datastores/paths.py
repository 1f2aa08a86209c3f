"""Job paths inside a datastore: always below the datastore's root, whatever the job asks for.

docs/product-rules.md: with root `/dir2`, a job asking for `/subdir2` gets `/dir2/subdir2`, and nothing
above the root is reachable. Two levels enforce that:

- `join_under_root(root, requested)` is the string rule (contracts/regional.py, shared with the control
  plane, which validates job specs with it): the requested path is always relative to the root (a leading
  `/` means "the root"), and `..`, NUL and over-long paths are refused with a message that says how to
  write the path instead.
- `open_in_root(root_dir, requested)` resolves the path in a real directory tree (the datastore root
  mounted on the node) with chroot semantics, like openat2(RESOLVE_IN_ROOT): a symlink's absolute
  target starts again at the root, and `..` inside a target stops at the root. It walks with O_PATH
  file descriptors, one component at a time relative to the already-opened parent, so a symlink
  swapped while we walk cannot redirect us; the caller mounts the returned descriptor itself
  (/proc/self/fd/N), never the path string, which closes the check-then-use gap.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path, PurePosixPath

from contracts.errors import InvalidInput, NotFound
from contracts.regional import join_under_root, normalize_root, requested_parts

__all__ = ["join_under_root", "normalize_root", "open_in_root", "requested_parts"]

MAX_SYMLINKS = 40  # the kernel's own limit (ELOOP)


def open_in_root(root_dir: Path, requested: str) -> tuple[int, PurePosixPath]:  # noqa: C901
    """Open `requested` inside the real tree at `root_dir`; returns (O_PATH fd, path relative to root).

    The caller owns the descriptor. A missing component raises NotFound; a symlink loop InvalidInput.
    """
    pending = requested_parts(requested)
    root_fd = os.open(root_dir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    stack: list[tuple[str, int]] = []  # (name, fd) of each directory entered below the root
    links = 0

    def current() -> int:
        return stack[-1][1] if stack else root_fd

    try:
        while pending:
            name = pending.pop(0)
            if name in ("", "."):
                continue
            if name == "..":  # only from a symlink target: clamp at the root
                if stack:
                    os.close(stack.pop()[1])
                continue
            try:
                fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=current())
            except FileNotFoundError:
                shown = PurePosixPath("/", *[n for n, _ in stack], name)
                raise NotFound(f"{shown} does not exist in the datastore; create it there first") from None
            except NotADirectoryError:
                shown = PurePosixPath("/", *[n for n, _ in stack])
                raise InvalidInput(f"{shown} is a file, not a directory; ask for a directory path") from None
            if stat.S_ISLNK(os.fstat(fd).st_mode):
                os.close(fd)
                links += 1
                if links > MAX_SYMLINKS:
                    raise InvalidInput(
                        f"too many symbolic links under {requested!r} (a loop?); "
                        "fix the links in the datastore"
                    )
                target = os.readlink(name, dir_fd=current())
                if target.startswith("/"):  # absolute: relative to the datastore root, not the node
                    while stack:
                        os.close(stack.pop()[1])
                pending[:0] = target.split("/")
                continue
            stack.append((name, fd))
        result_fd = os.dup(current())
        return result_fd, PurePosixPath("/", *[n for n, _ in stack])
    finally:
        for _, fd in stack:
            os.close(fd)
        os.close(root_fd)


def resolve_in_root(root_dir: Path, requested: str) -> Path:
    """Where `requested` lands inside `root_dir` (see open_in_root); for display and tests."""
    fd, relative = open_in_root(root_dir, requested)
    os.close(fd)
    return root_dir.joinpath(*relative.parts[1:])


def is_within(root_dir: Path, path: Path) -> bool:
    """True when `path`, with every symlink resolved by the kernel, is `root_dir` or below it."""
    root = os.path.realpath(root_dir)
    try:
        real = os.path.realpath(path, strict=True)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ELOOP):
            return False
        raise
    return real == root or real.startswith(root.rstrip("/") + "/")
