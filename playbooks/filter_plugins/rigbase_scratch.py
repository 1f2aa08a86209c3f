"""Ansible filters `rigbase_scratch_layout` (the scratch volume a node gets from its NVMe drives) and
`rigbase_cache_layout` (the local data cache a compute node in a local-mode region gets from its SATA
drives).

Computed in one pure function so a lab root (no block devices) and a real node get byte-identical
/etc/rigbase/scratch.yaml and fstab entries for the same inputs; only the real node goes on to
partition, assemble and format. The filesystem is addressed by LABEL in fstab because its UUID only
exists after mkfs, which a lab never runs.

Rules: no drive → no scratch volume; one drive → one GPT partition formatted directly; two or more →
one partition per drive striped as RAID0 (md) — scratch is a cache of data that lives elsewhere, so
capacity and bandwidth win over redundancy.

Local data cache (compute node, storage mode `local`): the region requires at least three SATA drives
(docs/hardware.md); they become one md RAID5 array. Why RAID5: the cache holds data sets that are slow
to fetch again (hours over a WAN for a large one), on spinning SATA drives that fail far more often than
NVMe, so losing one drive must not lose the whole cache or stop the jobs reading it — which RAID0 would.
RAID5 survives one drive with the capacity of n-1 drives and works with any count from three (RAID10
needs an even count and gives up half); the cache is read-mostly, so RAID5's slower small writes cost
little.
"""

from __future__ import annotations

import re
from typing import Any

SCRATCH_LABEL = "rigbase-scratch"  # ext4 labels hold 16 bytes
MD_NAME = "rigbase-scratch"
FSTYPE = "ext4"
CACHE_LABEL = "rigbase-cache"
CACHE_MD_NAME = "rigbase-cache"
CACHE_RAID_LEVEL = 5
CACHE_MIN_DRIVES = 3


def partition_path(device: str, number: int = 1) -> str:
    """/dev/nvme0n1 → /dev/nvme0n1p1, /dev/sda → /dev/sda1 (the kernel adds 'p' after a digit)."""
    return f"{device}p{number}" if re.search(r"\d$", device) else f"{device}{number}"


def scratch_layout(
    drives: list[dict[str, Any]] | list[str],
    mountpoint: str = "/scratch",
    label: str = SCRATCH_LABEL,
    exclude: list[str] | None = None,
) -> dict[str, Any]:
    """`exclude`: drives found in use on a real node (the one holding the OS)."""
    paths, excluded, sizes = _free_drives(drives, exclude)
    partitions = [partition_path(p) for p in paths]
    if not paths:
        kind, device, raid = "none", None, None
    elif len(paths) == 1:
        kind, device, raid = "single", partitions[0], None
    else:
        kind, raid = "raid0", _raid(MD_NAME, 0, partitions)
        device = raid["device"]
    total = sum(sizes.get(p, 0) for p in paths)
    return _layout(kind, paths, excluded, partitions, raid, device, label, mountpoint, total)


def cache_layout(
    drives: list[dict[str, Any]] | list[str],
    mountpoint: str = "/data/cache",
    label: str = CACHE_LABEL,
    exclude: list[str] | None = None,
) -> dict[str, Any]:
    """The local data cache: every SATA drive not in use (`exclude`) as one RAID5 array, ext4."""
    paths, excluded, sizes = _free_drives(drives, exclude)
    if len(paths) < CACHE_MIN_DRIVES:
        raise ValueError(
            f"a compute node in a local-mode region needs at least {CACHE_MIN_DRIVES} free SATA drives for "
            f"its data cache, found {len(paths)} ({', '.join(paths) or 'none'})"
        )
    partitions = [partition_path(p) for p in paths]
    raid = _raid(CACHE_MD_NAME, CACHE_RAID_LEVEL, partitions)
    smallest = min(sizes.get(p, 0) for p in paths)
    capacity = smallest * (len(paths) - 1)  # RAID5: n-1 drives of the smallest size
    kind = f"raid{CACHE_RAID_LEVEL}"
    return _layout(kind, paths, excluded, partitions, raid, raid["device"], label, mountpoint, capacity)


def _free_drives(
    drives: list[dict[str, Any]] | list[str], exclude: list[str] | None
) -> tuple[list[str], list[str], dict[str, int]]:
    """The drives' paths less `exclude` (sorted, each checked to be under /dev), the excluded paths
    (sorted), and the sizes the inventory gave (drives may be bare paths, with no size)."""
    excluded = sorted(set(exclude or []))
    paths = sorted({d if isinstance(d, str) else d["path"] for d in drives or []} - set(excluded))
    sizes = {d["path"]: int(d.get("size_bytes") or 0) for d in drives or [] if isinstance(d, dict)}
    for path in paths:
        if not re.fullmatch(r"/dev/[A-Za-z0-9/_-]+", path):
            raise ValueError(f"{path!r} is not a block device path under /dev")
    return paths, excluded, sizes


def _raid(name: str, level: int, members: list[str]) -> dict[str, Any]:
    return {"device": f"/dev/md/{name}", "name": name, "level": level, "members": members}


def _layout(
    kind: str,
    paths: list[str],
    excluded: list[str],
    partitions: list[str],
    raid: dict[str, Any] | None,
    device: str | None,
    label: str,
    mountpoint: str,
    size_bytes: int,
) -> dict[str, Any]:
    """The filter's answer; with no device (no drive for scratch) there is nothing to format or mount."""
    return {
        "kind": kind,
        "drives": paths,
        "excluded": excluded,
        "partitions": partitions,
        "raid": raid,
        "device": device,
        "filesystem": FSTYPE if device else None,
        "label": label if device else None,
        "mountpoint": mountpoint,
        "size_bytes": size_bytes or None,  # unknown (bare paths, sizes of 0) rather than 0 bytes
        # nofail: a dead scratch or cache drive must not keep the node from booting and reporting the fault
        "fstab": f"LABEL={label} {mountpoint} {FSTYPE} defaults,noatime,nofail 0 2" if device else None,
    }


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"rigbase_scratch_layout": scratch_layout, "rigbase_cache_layout": cache_layout}
