"""Fetching what a job's worker left (`provision job output --download`): its manifest, then every chunk,
each checked against its SHA-256, written below the directory given. Paths are the manifest's relative
ones (contracts/data_objects.py checks them), so nothing is written outside that directory."""

from __future__ import annotations

import hashlib
from pathlib import Path

from contracts.data_objects import Manifest
from provisioner.client.errors import ControlPlaneError
from provisioner.client.http import Client


def download_output(client: Client, job: str, worker: int, dest: Path) -> tuple[int, int]:
    """(files, bytes) written below `dest`."""
    base = f"/v1/jobs/{job}/outputs/{worker}"
    manifest = Manifest.model_validate(client.get(f"{base}/manifest"))
    dest.mkdir(parents=True, exist_ok=True)
    for entry in manifest.files:
        target = dest / entry.path
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("wb") as fh:
            for sha in entry.chunks:
                data = client.get_bytes(f"{base}/chunks/{sha}")
                if hashlib.sha256(data).hexdigest() != sha:
                    raise ControlPlaneError(
                        f"{entry.path}: a chunk did not match its SHA-256: download again"
                    )
                fh.write(data)
        target.chmod((entry.mode & 0o755) | 0o600)  # never unreadable to the one who fetched it
    return len(manifest.files), manifest.size
