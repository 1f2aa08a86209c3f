"""The root filesystem image: mkfs.ext4 -d (no mounts, no loop devices), then pin what mke2fs 1.47.0
takes from the build host's clock and inode ctimes, so the same tree gives the same bytes."""

from __future__ import annotations

import os
import struct
import subprocess
from pathlib import Path

from image_builder.errors import BuildError

#: No journal (the root is read-only under verity) and no metadata_csum (its per-inode checksums would
#: have to be recomputed after pinning timestamps; verity already guards every block).
FEATURES = "^has_journal,^metadata_csum,^orphan_file"
#: A filesystem the node writes (the GCE disk's state partition) keeps its journal: without one, a power
#: cut while the minion writes leaves inconsistencies that the boot's `e2fsck -p` will not repair, and the
#: partition is then not mounted at all. Still no metadata_csum, for the reason above.
WRITABLE_FEATURES = "^metadata_csum,^orphan_file"


def make(
    tree: Path,
    image: Path,
    uuid: str,
    label: str,
    epoch: int,
    slack: float = 1.10,
    *,
    features: str = FEATURES,
    size_mb: int | None = None,
) -> Path:
    """Size the image from the tree (plus slack for metadata) unless `size_mb` is given, build it and pin
    its timestamps."""
    if size_mb is None:
        size_mb = int(_tree_bytes(tree) * slack / 2**20) + 64
    image.unlink(missing_ok=True)
    env = dict(os.environ, E2FSPROGS_FAKE_TIME=str(epoch), SOURCE_DATE_EPOCH=str(epoch))
    argv = [
        "mkfs.ext4",
        "-q",
        "-F",
        "-b",
        "4096",
        "-I",
        "256",
        "-m",
        "0",
        "-O",
        features,
        "-L",
        label,
        "-U",
        uuid,
        "-E",
        f"hash_seed={uuid},root_owner=0:0,lazy_itable_init=0,nodiscard",
        "-d",
        str(tree),
        str(image),
        f"{size_mb}M",
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise BuildError(f"mkfs.ext4 failed: {proc.stderr.strip()[-300:]}")
    pin_times(image, epoch)
    return image


def _tree_bytes(tree: Path) -> int:
    total = 0
    for dirpath, dirnames, filenames in os.walk(tree):
        total += 4096 * (1 + len(dirnames))
        for f in filenames:
            st = os.lstat(os.path.join(dirpath, f))
            total += (st.st_size + 4095) // 4096 * 4096 + 256
    return total


def pin_times(image: Path, epoch: int) -> int:
    """Set every in-use inode's atime/ctime/mtime/crtime to `epoch` and the superblock's times too.
    Returns how many inodes were touched."""
    with image.open("r+b") as fh:
        sb = bytearray(_read(fh, 1024, 1024))
        if struct.unpack_from("<H", sb, 56)[0] != 0xEF53:
            raise BuildError(f"{image} is not an ext4 image.")
        block = 1024 << struct.unpack_from("<I", sb, 24)[0]
        blocks = struct.unpack_from("<I", sb, 4)[0]
        (per_group_blocks,) = struct.unpack_from("<I", sb, 32)
        (per_group_inodes,) = struct.unpack_from("<I", sb, 40)
        (inode_size,) = struct.unpack_from("<H", sb, 88)
        (incompat,) = struct.unpack_from("<I", sb, 96)
        desc_size = struct.unpack_from("<H", sb, 254)[0] if incompat & 0x80 else 32
        (first_data,) = struct.unpack_from("<I", sb, 20)
        groups = (blocks - first_data + per_group_blocks - 1) // per_group_blocks
        for off in (44, 48, 64, 0x108):  # s_mtime, s_wtime, s_lastcheck, s_mkfs_time
            struct.pack_into("<I", sb, off, epoch)
        fh.seek(1024)
        fh.write(sb)
        gdt = _read(fh, (first_data + 1) * block, groups * desc_size)
        touched = 0
        for g in range(groups):
            d = g * desc_size
            table = struct.unpack_from("<I", gdt, d + 8)[0]
            if desc_size >= 64:
                table |= struct.unpack_from("<I", gdt, d + 0x28)[0] << 32
            raw = bytearray(_read(fh, table * block, per_group_inodes * inode_size))
            changed = False
            for i in range(per_group_inodes):
                o = i * inode_size
                if struct.unpack_from("<H", raw, o + 26)[0] == 0:  # i_links_count: unused inode
                    continue
                struct.pack_into("<III", raw, o + 8, epoch, epoch, epoch)
                if inode_size > 128:
                    (extra,) = struct.unpack_from("<H", raw, o + 128)
                    if extra >= 24:
                        struct.pack_into("<IIIII", raw, o + 132, 0, 0, 0, epoch, 0)
                touched += 1
                changed = True
            if changed:
                fh.seek(table * block)
                fh.write(raw)
    return touched


def _read(fh, offset: int, n: int) -> bytes:
    fh.seek(offset)
    return fh.read(n)
