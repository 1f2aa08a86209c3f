"""dm-verity over the root filesystem image: its root hash goes on the UKI's command line, so the
measurement of the UKI (PCR 11) covers every byte of the OS, the minion included."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from image_builder.errors import BuildError

#: Fixed salt and UUID: veritysetup picks random ones otherwise, and the image would differ per build.
SALT = "72696762617365" + "00" * 25  # "rigbase" padded to 32 bytes
HASH_UUID = "8f2c7a4e-52b1-4f0e-9d6a-2f1f5e3c0a11"


@dataclass(frozen=True)
class Verity:
    root_hash: str
    hash_path: Path
    data_blocks: int


def format_hash(data_image: Path, hash_image: Path) -> Verity:
    """`veritysetup format` with pinned salt and UUID; returns the root hash."""
    hash_image.unlink(missing_ok=True)
    proc = subprocess.run(
        [
            "veritysetup",
            "format",
            f"--salt={SALT}",
            f"--uuid={HASH_UUID}",
            "--data-block-size=4096",
            "--hash-block-size=4096",
            str(data_image),
            str(hash_image),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise BuildError(
            f"veritysetup format failed: {proc.stderr.strip()}; check that cryptsetup-bin is installed."
        )
    root = re.search(r"Root hash:\s*([0-9a-f]{64})", proc.stdout)
    blocks = re.search(r"Data blocks:\s*(\d+)", proc.stdout)
    if not root or not blocks:
        raise BuildError(f"could not read the root hash from veritysetup's output: {proc.stdout!r}")
    return Verity(root_hash=root.group(1), hash_path=hash_image, data_blocks=int(blocks.group(1)))


def verify(data_image: Path, hash_image: Path, root_hash: str) -> bool:
    """Whole-image check on the host (the guest checks block by block as it reads)."""
    proc = subprocess.run(
        ["veritysetup", "verify", str(data_image), str(hash_image), root_hash],
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.returncode == 0
