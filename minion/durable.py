"""Files on the state partition that must survive a power cut: written whole or not at all, and still
there after one. A node is often reset hard (the reset button, a PDU, `system_reset` in the tests): data
fsynced but renamed into place without an fsync of the directory can vanish with the rename, and the node
then forgets its saved finalize configuration or its credential a few seconds after it wrote them."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write `data` to `path` through a temporary file (readable by `mode` only, never anything wider),
    fsync it, rename it into place and fsync the directory, so the rename itself is on disk."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fchmod(f.fileno(), mode)  # O_CREAT's mode does not apply to a leftover .tmp
        os.fsync(f.fileno())
    os.replace(tmp, path)
    directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
