"""The USB disk image: GPT (sfdisk, fixed GUIDs) with an ESP (mkfs.vfat + mtools), the ext4 root and
its verity hash tree. Assembled in a plain file: no mounts, no loop devices."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from image_builder.errors import BuildError

MiB = 2**20
SECTOR = 512

ESP_TYPE = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B"
ROOT_TYPE = "4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709"  # Linux root (x86-64), Discoverable Partitions Spec
VERITY_TYPE = "2C7357ED-EBD2-46D9-AEC1-23D437EC2BF5"  # Linux root verity (x86-64)
LINUX_TYPE = "0FC63DAF-8483-4772-8E79-3D69D8477DE4"  # Linux filesystem data (the state partition)


@dataclass(frozen=True)
class Partition:
    name: str
    type_guid: str
    uuid: str
    source: Path | None  # image file written into the partition; None = left empty
    size: int  # bytes, a multiple of 1 MiB


@dataclass(frozen=True)
class Layout:
    disk_guid: str
    partitions: tuple[Partition, ...]


def mib(n: int) -> int:
    return (n + MiB - 1) // MiB * MiB


def make_esp(out: Path, size: int, files: dict[str, Path], volume_id: str, epoch: int) -> Path:
    """FAT ESP with a fixed volume id; mtools stamps entries from SOURCE_DATE_EPOCH, files keep pinned
    mtimes."""
    out.unlink(missing_ok=True)
    env = dict(os.environ, SOURCE_DATE_EPOCH=str(epoch), MTOOLS_SKIP_CHECK="1")
    _run(
        ["mkfs.vfat", "--invariant", "-i", volume_id, "-n", "RIGBASE", "-C", str(out), str(size // 1024)], env
    )
    made: set[str] = set()
    for dest in sorted(files):
        parts = dest.strip("/").split("/")
        for i in range(1, len(parts)):
            d = "/".join(parts[:i])
            if d not in made:
                _run(["mmd", "-i", str(out), f"::/{d}"], env)
                made.add(d)
        src = files[dest]
        os.utime(src, (epoch, epoch))
        _run(["mcopy", "-m", "-i", str(out), str(src), f"::/{dest.strip('/')}"], env)
    return out


def write_image(layout: Layout, out: Path, size: int | None = None) -> Path:
    """Create the disk file (`size` bytes, default just large enough), partition it with sfdisk and copy
    each partition image into place."""
    first = MiB
    total = size or first + sum(p.size for p in layout.partitions) + MiB  # room for the backup GPT
    out.unlink(missing_ok=True)
    with out.open("wb") as fh:
        fh.truncate(total)
    script = ["label: gpt", f"label-id: {layout.disk_guid}", "unit: sectors", "first-lba: 2048", ""]
    start = first
    for p in layout.partitions:
        script.append(
            f"start={start // SECTOR}, size={p.size // SECTOR}, type={p.type_guid}, "
            f'uuid={p.uuid}, name="{p.name}"'
        )
        start += p.size
    proc = subprocess.run(
        ["sfdisk", "--no-reread", "--no-tell-kernel", "-q", str(out)],
        input="\n".join(script) + "\n",
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise BuildError(f"sfdisk could not partition the image: {proc.stderr.strip()}")
    start = first
    with out.open("r+b") as fh:
        for p in layout.partitions:
            if p.source is not None:
                if p.source.stat().st_size > p.size:
                    raise BuildError(f"partition {p.name} is too small for {p.source.name}.")
                fh.seek(start)
                with p.source.open("rb") as src:
                    shutil.copyfileobj(src, fh, 8 * MiB)
            start += p.size
    return out


def partition_offsets(layout: Layout) -> dict[str, tuple[int, int]]:
    """name → (byte offset, size) in the disk image; tests use it to flip bytes inside one partition."""
    offsets, start = {}, MiB
    for p in layout.partitions:
        offsets[p.name] = (start, p.size)
        start += p.size
    return offsets


def _run(argv: list[str], env: dict[str, str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise BuildError(f"{argv[0]} failed: {proc.stderr.strip()}")
