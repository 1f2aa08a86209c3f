"""minion/durable.py: the state partition's files are written whole, 0600, and their rename is fsynced
with the directory (a node reset seconds after finalize or a join kept neither before: the saved finalize
configuration was gone after the node-life VM test's reset in CI)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from minion.durable import write_atomic
from minion.join.state import write_private


def test_written_whole_private_and_the_directory_synced_after_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "state" / "node.json"
    target.parent.mkdir()
    leftover = target.with_name("node.json.tmp")
    leftover.write_text("half")
    leftover.chmod(0o644)  # a killed writer's temporary file: never world-readable once it holds secrets
    synced: list[tuple[str, bool]] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        info = os.fstat(fd)
        synced.append(("dir" if stat.S_ISDIR(info.st_mode) else "file", target.exists()))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    write_private(target, {"node_id": "n1"})
    assert target.read_text().startswith("{") and '"node_id": "n1"' in target.read_text()
    assert stat.S_IMODE(target.stat().st_mode) == 0o600 and not leftover.exists()
    # the file's data before the rename, the directory (holding the new name) after it
    assert synced == [("file", False), ("dir", True)]
    write_atomic(target, b"second")
    assert target.read_bytes() == b"second" and synced[-1] == ("dir", True)
