"""The GCE target: the same UKI and verity root as the USB drive, laid out as a Compute Engine boot disk.

`disk.raw` in a gzip'd tar is what `images.insert` imports (rawDisk.source). Its size must be a whole
number of GiB, and the tar must hold that one file. The layout is the installed layout the initramfs
already boots (rigbase-os-root / rigbase-os-verity, so the same UKI, the same initramfs and therefore the
same PCR 11 and 12): an ESP with systemd-boot and the UKI, the root, its verity tree, and the state
partition last, so that it can grow to the disk the VM was given (rigbase-grow-state at first boot). No
installer runs (the initramfs reports the boot source `nvme`) and the ESP carries no bundle: a VM reads its
region's bundle from the instance metadata server (minion gce-bundle)."""

from __future__ import annotations

import gzip
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from image_builder import disk, ext4, initramfs
from image_builder.plan import GCE_ARCHIVE, GCE_DISK, IDS

GiB = 2**30
MiB = disk.MiB
#: What the GCE firmware loads from the boot disk's ESP, as on the USB drive: systemd-boot (BOOTX64.EFI),
#: the UKI, the kernel. PCR 4 is the same chain of Authenticode digests.
GCE_BOOT_PATH: tuple[str, ...] = ("systemd-boot", "uki", "kernel")
MIN_STATE = 256 * MiB  # what the first boot has before the partition grows


@dataclass(frozen=True)
class GceDisk:
    archive: Path
    raw_size: int
    raw_sha256: str
    layout: disk.Layout


def layout(esp: Path, esp_size: int, root: Path, verity_tree: Path, state: Path) -> disk.Layout:
    """The boot disk's partitions; the state partition takes what is left of the last GiB."""
    fixed = [
        disk.Partition("rigbase-esp", disk.ESP_TYPE, IDS["gce_esp_partuuid"], esp, esp_size),
        disk.Partition(
            initramfs.OS_ROOT, disk.ROOT_TYPE, IDS["gce_root_partuuid"], root, disk.mib(root.stat().st_size)
        ),
        disk.Partition(
            initramfs.OS_VERITY,
            disk.VERITY_TYPE,
            IDS["gce_verity_partuuid"],
            verity_tree,
            disk.mib(verity_tree.stat().st_size),
        ),
    ]
    overhead = 2 * MiB  # the primary GPT before the first partition, the backup GPT after the last
    used = overhead + sum(p.size for p in fixed) + max(MIN_STATE, disk.mib(state.stat().st_size))
    total = -(-used // GiB) * GiB
    state_size = total - overhead - sum(p.size for p in fixed)
    return disk.Layout(
        IDS["gce_disk_guid"],
        (
            *fixed,
            disk.Partition(initramfs.OS_STATE, disk.LINUX_TYPE, IDS["gce_state_partuuid"], state, state_size),
        ),
    )


def state_filesystem(work: Path, epoch: int) -> Path:
    """An empty ext4 labelled like the installer's state partition (fstab mounts it by PARTLABEL), with a
    journal as the installer's has (a VM is stopped hard: a spot VM's preemption, a reset), MIN_STATE large;
    the first boot grows it to its partition (rigbase-grow-state)."""
    empty = work / "gce-state-tree"
    empty.mkdir()
    return ext4.make(
        empty,
        work / "gce-state.ext4",
        IDS["gce_state_fs_uuid"],
        initramfs.OS_STATE,
        epoch,
        features=ext4.WRITABLE_FEATURES,
        size_mb=MIN_STATE // MiB,
    )


def archive(raw: Path, out: Path, epoch: int) -> Path:
    """`disk.raw` alone in a gzip'd GNU tar, owner root, mtime pinned: the same disk gives the same bytes."""
    info = tarfile.TarInfo(GCE_DISK)
    info.size = raw.stat().st_size
    info.mtime = epoch
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    with (
        out.open("wb") as fh,
        gzip.GzipFile(filename="", mode="wb", fileobj=fh, mtime=0, compresslevel=6) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.GNU_FORMAT) as tar,
        raw.open("rb") as src,
    ):
        tar.addfile(info, src)
    return out


def build(
    work: Path,
    out_dir: Path,
    esp: Path,
    esp_size: int,
    root: Path,
    verity_tree: Path,
    epoch: int,
    sha256_file: Callable[[Path], str],
) -> GceDisk:
    """Write disk.raw, archive it into out_dir, keep only the archive (and disk.raw's digest)."""
    lay = layout(esp, esp_size, root, verity_tree, state_filesystem(work, epoch))
    raw = disk.write_image(lay, work / GCE_DISK, size=sum(p.size for p in lay.partitions) + 2 * MiB)
    made = archive(raw, out_dir / GCE_ARCHIVE, epoch)
    result = GceDisk(made, raw.stat().st_size, sha256_file(raw), lay)
    raw.unlink()
    return result
