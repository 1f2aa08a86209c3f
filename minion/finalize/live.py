"""What is true on the node right now about the storage its finalize set up: whether each mount point the
play recorded is mounted, from which device, and which NFS exports are active. Reported with the finalize
actual state on every heartbeat, so an operator sees that a reboot brought /scratch and the export back
(`provision node show`) — the play's layout files only say what was intended."""

from __future__ import annotations

from pathlib import Path
from typing import Any

PROC_MOUNTS = Path("/proc/self/mounts")
NFS_ETAB = Path("/var/lib/nfs/etab")  # what exportfs has exported (path, then options)


def _mount_points(facts: dict[str, Any]) -> list[str]:
    points = []
    for section in facts.values():
        if not isinstance(section, dict):
            continue
        if isinstance(section.get("mountpoint"), str):
            points.append(section["mountpoint"])
        cache = section.get("cache")
        if isinstance(cache, dict) and isinstance(cache.get("mountpoint"), str):
            points.append(cache["mountpoint"])
    return sorted(set(points))


def _mounts(proc_mounts: Path) -> dict[str, str]:
    try:
        lines = proc_mounts.read_text().splitlines()
    except OSError:
        return {}
    # octal escapes (\040 for a space) in the fields, as the kernel writes them
    return {
        fields[1].encode().decode("unicode_escape"): fields[0]
        for line in lines
        if len(fields := line.split()) >= 2
    }


def _exports(etab: Path) -> list[str]:
    try:
        return sorted({line.split()[0] for line in etab.read_text().splitlines() if line.strip()})
    except OSError:
        return []


def live_state(
    facts: dict[str, Any], proc_mounts: Path = PROC_MOUNTS, etab: Path = NFS_ETAB
) -> dict[str, Any]:
    """{"mounts": {mount point: source device or None}, "exports": [exported paths]}."""
    mounted = _mounts(proc_mounts)
    return {
        "mounts": {point: mounted.get(point) for point in _mount_points(facts)},
        "exports": _exports(etab),
    }
