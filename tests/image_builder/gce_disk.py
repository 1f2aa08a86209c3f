"""What the GCE tests check of a `rigbase-gce.tar.gz`: images.insert's rules (one file, disk.raw, a whole
number of GiB, a GNU tar in gzip) and the partition table, with the real tar, sfdisk and mtools."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

GiB = 2**30


def unpack(archive: Path, into: Path) -> Path:
    """Extract with GNU tar as GCE's importer does; the archive must list exactly disk.raw."""
    listing = subprocess.run(["tar", "-tzvf", str(archive)], capture_output=True, text=True, check=True)
    lines = listing.stdout.splitlines()
    assert len(lines) == 1 and lines[0].endswith(" disk.raw"), lines
    assert lines[0].startswith("-rw-r--r-- root/root"), lines[0]
    into.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-xzf", str(archive), "-C", str(into)], check=True)
    raw = into / "disk.raw"
    assert raw.stat().st_size % GiB == 0
    return raw


def partitions(raw: Path) -> list[dict]:
    out = subprocess.run(["sfdisk", "--json", str(raw)], capture_output=True, text=True, check=True).stdout
    return json.loads(out)["partitiontable"]["partitions"]


def esp_files(raw: Path, offset: int) -> str:
    """`mdir -/` of the ESP at `offset` bytes: every path on it."""
    return subprocess.run(
        ["mdir", "-/", "-b", "-i", f"{raw}@@{offset}", "::/"],
        capture_output=True,
        text=True,
        env={**os.environ, "MTOOLS_SKIP_CHECK": "1"},
        check=True,
    ).stdout


def grow(raw: Path, to_bytes: int, script: Path) -> dict:
    """What rigbase-grow-state does at first boot, on a copy of the disk made `to_bytes` large (as a VM's
    boot disk of disk_size_gb): returns the last partition after it ran (twice: it is idempotent)."""
    with raw.open("r+b") as fh:
        fh.truncate(to_bytes)
    last = len(partitions(raw))
    for _ in range(2):
        subprocess.run(["sh", str(script), str(raw), str(last)], check=True, capture_output=True)
    return partitions(raw)[-1]
