"""The lab's job image: the cached Debian root, imported into podman as `localhost/rigbase-lab:latest`.

No registry is reachable from the lab, so job specs in the lab name this local image. It is made from the
same debootstrap'd base the nodes' roots are cloned from (minbase + python3: `sh`, coreutils, python3),
with `tar -C ROOT -c . | podman import - …` (~7 s for the 170 MB root), once per base: the image is also
tagged with the base's cache key (`localhost/rigbase-lab:<key>`, the hash of every debootstrap input,
rootfs.RootfsSpec.key), so a warm `lab up` only checks that the tag exists and points `latest` at it, and
a new base (another suite or mirror) gets a new image. The image lives in podman's own store (the one the
lab's minions use) and, like the rootfs cache, outlives `lab down`: `podman rmi localhost/rigbase-lab`
removes it.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
from pathlib import Path

from contracts.errors import Unavailable

REPOSITORY = "localhost/rigbase-lab"
IMAGE = f"{REPOSITORY}:latest"
KEY_LABEL = "rigbase.rootfs"  # the base's cache key, also kept as a label on the image
IMPORT_TIMEOUT_S = 300
QUERY_TIMEOUT_S = 60


def tag_of(key: str, repository: str = REPOSITORY) -> str:
    return f"{repository}:{key}"


def base_key(root: Path) -> str:
    """The cache key of a base root at CACHE/<key>/root (rootfs.ensure_base's layout)."""
    return root.parent.name


def _podman(podman: str, *args: str, timeout: float = QUERY_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run([podman, *args], capture_output=True, text=True, timeout=timeout)


def _image_id(podman: str, ref: str) -> str | None:
    proc = _podman(podman, "image", "inspect", "--format", "{{.Id}}", ref)
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def ensure_image(
    root: Path, *, podman: str = "podman", lock_dir: Path | None = None, repository: str = REPOSITORY
) -> tuple[str, bool]:
    """Import `root` as the lab's job image unless the image of its key exists; point `latest` at it.

    Returns (the image's id, whether it was imported now). One importer at a time (a parallel `lab up` or
    test waits for the first, then finds the image)."""
    if shutil.which(podman) is None:
        raise Unavailable(f"{podman} is not installed: run scripts/install-deps.sh (podman runc catatonit)")
    if not root.is_dir():
        raise Unavailable(f"the lab's Debian root {root} is missing: run `provision lab up` to build it")
    key = base_key(root)
    lock = (lock_dir or root.parent.parent) / f"{key}.image.lock"
    with open(lock, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        imported = False
        keyed, latest = tag_of(key, repository), f"{repository}:latest"
        image_id = _image_id(podman, keyed)
        if image_id is None:
            image_id = _import(root, keyed, key, podman)
            imported = True
        if _image_id(podman, latest) != image_id:
            proc = _podman(podman, "tag", image_id, latest)
            if proc.returncode != 0:
                raise Unavailable(f"podman tag {latest} failed ({proc.stderr.strip()}): see `podman images`")
    return image_id, imported


def _import(root: Path, tag: str, key: str, podman: str) -> str:
    """`tar -C ROOT -c . | podman import - localhost/rigbase-lab:KEY`, the two joined by a pipe."""
    tar = subprocess.Popen(
        ["tar", "-C", str(root), "--numeric-owner", "-c", "."],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert tar.stdout is not None
    try:
        imp = subprocess.run(
            [podman, "import", "--change", f"LABEL {KEY_LABEL}={key}", "-", tag],
            stdin=tar.stdout,
            capture_output=True,
            text=True,
            timeout=IMPORT_TIMEOUT_S,
        )
    finally:
        tar.stdout.close()
        tar_err = tar.stderr.read().decode(errors="replace").strip() if tar.stderr else ""
        tar.wait()
    if tar.returncode != 0 or imp.returncode != 0:
        why = imp.stderr.strip().splitlines()[-1:] or tar_err.splitlines()[-1:] or ["no output"]
        raise Unavailable(f"importing {root} as {tag} failed ({why[0]}): check `podman info`")
    return _image_id(podman, tag) or imp.stdout.strip()
