"""Units, written out the way the requirement and the hardware are sold.

Storage is decimal (a "1 TB" drive holds 1.0002 x 10^12 bytes, a "960 GB" one 0.96 x 10^12), memory and
GPU memory are binary (GiB), network speeds are the Mb/s sysfs reports. Every figure the rules print
carries its unit so an operator never has to guess which gigabyte is meant.
"""

from __future__ import annotations

import re

TB = 10**12
GB = 10**9
GIB = 2**30

# Transfer rate per lane (GT/s) -> PCIe generation, from the PCI-SIG generations.
_GENERATION_BY_SPEED: tuple[tuple[float, int], ...] = (
    (2.5, 1),
    (5.0, 2),
    (8.0, 3),
    (16.0, 4),
    (32.0, 5),
    (64.0, 6),
)
_SPEED_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*GT/s")


def parse_link_speed(text: str | bytes | None) -> float | None:
    """'16.0 GT/s PCIe' (or the older '16 GT/s') -> 16.0; 'Unknown' or garbage -> None."""
    if text is None:
        return None
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    match = _SPEED_RE.match(text)
    return float(match.group(1)) if match else None


def pcie_generation(speed_gts: float | None) -> int | None:
    if not speed_gts:
        return None
    for speed, generation in _GENERATION_BY_SPEED:
        if abs(speed - speed_gts) < 0.01:
            return generation
    return None


def storage(size_bytes: int) -> str:
    """Decimal size as drives are labelled: 960 GB, 1.00 TB, 15.36 TB."""
    if size_bytes >= TB:
        return f"{size_bytes / TB:.2f} TB"
    return f"{size_bytes / GB:.0f} GB"


def gib(size_bytes: int) -> str:
    value = size_bytes / GIB
    return f"{value:.0f} GiB" if abs(value - round(value)) < 0.05 else f"{value:.1f} GiB"


def link_speed(mbps: int | None) -> str:
    if mbps is None:
        return "speed unknown"
    if mbps >= 1000:
        value = mbps / 1000
        return f"{value:g} Gb/s"
    return f"{mbps} Mb/s"


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"
