"""The minion, from this repository's own wheel (`pip wheel --no-deps`), unpacked into the root filesystem.

Built from a clean copy of the source files git knows about, so stale build/ output or editor droppings
never reach a node, and the wheel's contents depend only on the source."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from image_builder.errors import BuildError

#: Packages of the distribution that a node runs; the control plane (provisioner) stays off the image.
NODE_PACKAGES = ("minion/", "image_builder/")


def source_files(repo: Path) -> list[str]:
    out = subprocess.run(["git", "-C", str(repo), "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                         capture_output=True, check=False)
    if out.returncode != 0:
        raise BuildError(f"{repo} is not a git checkout; run image-builder from the rigbase repository.")
    return sorted(f for f in out.stdout.decode().split("\0") if f and (repo / f).is_file())


def source_digest(repo: Path) -> str:
    md = hashlib.sha256()
    for f in source_files(repo):
        md.update(f.encode() + b"\0" + (repo / f).read_bytes() + b"\0")
    return md.hexdigest()


def build_wheel(repo: Path, out_dir: Path, epoch: int) -> Path:
    """SOURCE_DATE_EPOCH makes bdist_wheel stamp every zip entry alike, so the wheel's digest is stable."""
    with tempfile.TemporaryDirectory(prefix="rigbase-wheel-") as tmp:
        src = Path(tmp) / "src"
        for f in source_files(repo):
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(repo / f, src / f)
        proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out_dir), str(src)],
                              capture_output=True, text=True, check=False,
                              env=dict(os.environ, SOURCE_DATE_EPOCH=str(max(epoch, 315532800))))
        if proc.returncode != 0:
            raise BuildError(f"pip wheel failed: {proc.stderr.strip()[-300:]}")
    wheels = sorted(out_dir.glob("rigbase-*.whl"))
    if not wheels:
        raise BuildError("pip wheel produced no rigbase wheel.")
    return wheels[-1]


def unpack_node_packages(wheel: Path, site_packages: Path) -> list[str]:
    """Extract the node's packages and the dist-info; returns the extracted member names (sorted)."""
    names: list[str] = []
    with zipfile.ZipFile(wheel) as zf:
        for info in sorted(zf.infolist(), key=lambda i: i.filename):
            n = info.filename
            if info.is_dir() or not (n.startswith(NODE_PACKAGES) or ".dist-info/" in n):
                continue
            dest = site_packages / n
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(zf.read(info))
            names.append(n)
    return names
