"""Uploading a local file or directory as a dataset, model or checkpoint (docs/data.md, "Uploads").

The directory is scanned into its manifest and chunks (contracts/object_tree.py); the control
plane is asked which chunks it lacks, those are sent one by one, each checked against its SHA-256 there,
and the manifest finishes the object. An interrupted upload leaves the object `downloading`: the same
command again finds it, asks again, and sends only what is still missing."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contracts.object_tree import Tree, scan
from provisioner.client.errors import ControlPlaneError
from provisioner.client.http import Client
from provisioner.domain.states import ObjectState

PARALLEL = 4  # chunks sent at once
UPLOAD_PREFIX = "upload:"  # services/objects/data_objects.py keeps an uploaded object's source so

# told (bytes sent so far, bytes to send) after every chunk
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class Uploaded:
    row: dict[str, Any]
    chunks: int  # chunks of the object
    sent: int  # chunks this run sent (the rest the control plane held already)
    sent_bytes: int
    resumed: bool
    skipped: int  # links and special files left out


def _existing(client: Client, plural: str, name: str, project: str | None) -> dict[str, Any] | None:
    try:
        row: dict[str, Any] = client.get(f"/v1/{plural}/{name}", project=project)
    except ControlPlaneError as exc:
        if exc.status == 404:
            return None
        raise
    return row


def upload(
    client: Client,
    plural: str,
    name: str,
    path: Path,
    *,
    project: str | None,
    public: bool = False,
    progress: Progress | None = None,
    tree: Tree | None = None,
) -> Uploaded:
    """Create (or resume) the object NAME from `path`, and send what the control plane lacks."""
    source = str(path.resolve())
    tree = tree or scan(path)
    row = _existing(client, plural, name, project)
    resumed = row is not None
    if row is not None and not (
        row["state"] == ObjectState.DOWNLOADING and row["source"] == UPLOAD_PREFIX + source
    ):
        raise ControlPlaneError(
            f"{row['kind']} {name!r} already exists ({row['state']}, from {row['source']}): choose another "
            f"name, or remove it first",
            code="duplicate_name",
        )
    if row is None:
        body = {"name": name, "source": source, "project": project, "public": public}
        row = client.post(f"/v1/{plural}", body)
    object_id = row["id"]
    order = list(tree.pieces)
    missing = set(client.post(f"/v1/objects/{object_id}/missing", {"chunks": order})["missing"])
    todo = [sha for sha in order if sha in missing]
    total = sum(tree.pieces[sha].length for sha in todo)
    sent = 0
    lock = threading.Lock()
    if progress is not None:
        progress(0, total)

    def put(sha: str) -> None:
        nonlocal sent
        data = tree.pieces[sha].read()
        client.put_bytes(f"/v1/objects/{object_id}/chunks/{sha}", data)
        with lock:
            sent += len(data)
            if progress is not None:
                progress(sent, total)

    # a few chunks in flight at once: one at a time leaves the link idle while the server hashes and stores
    with ThreadPoolExecutor(max_workers=PARALLEL) as pool:
        for done in [pool.submit(put, sha) for sha in todo]:
            done.result()  # the first refusal is raised; chunks sent before it are kept, for a resume
    done = client.post(f"/v1/objects/{object_id}/manifest", tree.manifest.model_dump(mode="json"))
    return Uploaded(done, len(order), len(todo), sent, resumed, tree.skipped)
