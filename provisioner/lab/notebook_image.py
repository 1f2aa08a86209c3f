"""The lab's notebook image, `localhost/rigbase-lab-notebook`: its job image with JupyterLab and ipykernel.

The default notebook image (contracts.jobspec.DEFAULT_NOTEBOOK_IMAGE) is on quay.io, which the lab cannot
reach, so `provision lab notebook-image` makes a local one: pip, run here with `--prefix`, installs
JupyterLab for the image's Python (the lab's Debian root has the same CPython minor version as the
provisioner), and `podman build` lays the tree over the job image at /usr/local, where Debian's python3 and
Jupyter look (dist-packages, /usr/local/share/jupyter, /usr/local/etc/jupyter). The console scripts get
the image's interpreter in their shebang. The image is tagged with a key of its inputs (the base image's
id and the requirement), so it is built once per base and requirement; `latest` points at the newest.
"""

from __future__ import annotations

import fcntl
import hashlib
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Final

from contracts.errors import Unavailable

REPOSITORY: Final = "localhost/rigbase-lab-notebook"
IMAGE: Final = f"{REPOSITORY}:latest"
REQUIREMENTS: Final = ("jupyterlab>=4.2,<5", "ipykernel>=6.29")
PYTHON: Final = "/usr/bin/python3"  # the Debian root's interpreter
PIP_TIMEOUT_S: Final = 900
BUILD_TIMEOUT_S: Final = 600
CONTAINERFILE: Final = f"""\
FROM {{base}}
COPY site-packages/ /usr/local/lib/python3.{sys.version_info.minor}/dist-packages/
COPY bin/ /usr/local/bin/
COPY share/ /usr/local/share/
COPY etc/ /usr/local/etc/
LABEL rigbase.notebook={{key}}
"""


def image_key(base_id: str, requirements: tuple[str, ...] = REQUIREMENTS) -> str:
    return hashlib.sha256("\n".join((base_id, *requirements)).encode()).hexdigest()[:16]


def _run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def _image_id(podman: str, ref: str) -> str | None:
    proc = _run([podman, "image", "inspect", "--format", "{{.Id}}", ref], 60)
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def _last_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in (proc.stderr or proc.stdout).splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def _install(prefix: Path, requirements: tuple[str, ...]) -> None:
    """pip from PyPI (or its cache) into `prefix`; the scripts' shebangs then name the image's Python."""
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    cmd += ["--prefix", str(prefix), "--ignore-installed", "--no-warn-script-location", *requirements]
    proc = _run(cmd, PIP_TIMEOUT_S)
    site = prefix / "lib" / f"python3.{sys.version_info.minor}" / "site-packages"
    if proc.returncode != 0 or not (site / "jupyterlab").is_dir():
        raise Unavailable(
            f"pip install {' '.join(requirements)} failed ({_last_line(proc)}): is PyPI reachable?"
        )
    for script in (prefix / "bin").iterdir():
        data = script.read_bytes()
        if data.startswith(b"#!") and b"python" in data.split(b"\n", 1)[0]:
            script.write_bytes(b"#!" + PYTHON.encode() + b"\n" + data.split(b"\n", 1)[1])
    # ipykernel's kernel spec runs `python`; Debian's root has python3 only (a link: the build runs nothing)
    (prefix / "bin" / "python").symlink_to(PYTHON)
    for part in ("share", "etc"):
        (prefix / part).mkdir(exist_ok=True)
    site.rename(prefix / "site-packages")


def ensure_notebook_image(
    base_image: str,
    *,
    podman: str = "podman",
    lock_dir: Path,
    repository: str = REPOSITORY,
    requirements: tuple[str, ...] = REQUIREMENTS,
) -> tuple[str, bool]:
    """Build the notebook image over `base_image` unless the image of its key exists; point `latest` at it.
    Returns (its id, whether it was built now). One builder at a time."""
    base_id = _image_id(podman, base_image)
    if base_id is None:
        raise Unavailable(f"the lab's job image {base_image} is missing: run `provision lab up` first")
    key = image_key(base_id, requirements)
    keyed, latest = f"{repository}:{key}", f"{repository}:latest"
    with open(lock_dir / f"notebook-{key}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        image_id, built = _image_id(podman, keyed), False
        if image_id is None:
            with tempfile.TemporaryDirectory(prefix="rigbase-notebook-", dir=lock_dir) as tmp:
                context = Path(tmp)
                _install(context, requirements)
                (context / "Containerfile").write_text(CONTAINERFILE.format(base=base_id, key=key))
                proc = _run(
                    [podman, "build", "--network", "none", "-t", keyed, str(context)], BUILD_TIMEOUT_S
                )
                if proc.returncode != 0:
                    raise Unavailable(
                        f"podman build {keyed} failed ({_last_line(proc)}): check `podman info`"
                    )
            image_id, built = _image_id(podman, keyed), True
            assert image_id is not None
        if _image_id(podman, latest) != image_id:
            proc = _run([podman, "tag", image_id, latest], 60)
            if proc.returncode != 0:
                raise Unavailable(f"podman tag {latest} failed ({_last_line(proc)}): see `podman images`")
    return image_id, built
