"""The node's cache of datasets, models and checkpoints, fetched by digest (docs/data.md, "On the node").

A worker's object mount names the object and the digest of its manifest. The cache keeps each object
once, at ROOT/HEX (HEX: the digest's hex), however many workers mount it. A missing one is fetched over
the minion's outbound connection with the node credential: the manifest first, checked against the
digest, then every chunk, each checked against its SHA-256. A byte that does not match is refused and
fetched again (FETCH_TRIES times); the object is built under ROOT/.partial-HEX and renamed into place
only when whole, so a half-fetched object is never mounted. Files are read-only (no write or set-id
bits) and their paths are the manifest's relative ones, checked again here."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

from pydantic import ValidationError

from contracts.data_objects import CHUNK_ROUTE, MANIFEST_ROUTE, Manifest, check_relative
from contracts.errors import InvalidInput
from minion.join.client import ConnectionProblem, ControlPlane

log = logging.getLogger(__name__)

FETCH_TRIES: Final = 3
READ_ONLY: Final = 0o555  # the most a cached file or directory may be: no write, no set-id


class ObjectUnavailable(Exception):
    """The object cannot be fetched now; the message says why."""


class ObjectSource(Protocol):
    def manifest(self, object_id: str) -> bytes: ...

    def chunk(self, object_id: str, sha256: str) -> bytes: ...


@dataclass
class ControlPlaneObjects:
    """ObjectSource over the minion's own outbound connection, with the node credential."""

    cp: ControlPlane
    node: Callable[[], dict[str, Any]]

    def _get(self, path: str) -> bytes:
        node = self.node()
        try:
            answer = self.cp.get(path.format(node_id=node["node_id"]), token=node["node_credential"])
        except ConnectionProblem as exc:
            raise ObjectUnavailable(str(exc)) from None
        if answer.status_code != 200:
            raise ObjectUnavailable(
                f"the control plane answered HTTP {answer.status_code}: {answer.text[:200]}"
            )
        return answer.content

    def manifest(self, object_id: str) -> bytes:
        return self._get(MANIFEST_ROUTE.replace("{object_id}", object_id))

    def chunk(self, object_id: str, sha256: str) -> bytes:
        return self._get(CHUNK_ROUTE.replace("{object_id}", object_id).replace("{chunk}", sha256))


Progress = Callable[[int, int], None]  # bytes fetched, bytes of the object


@dataclass
class ObjectCache:
    root: Path
    source: ObjectSource
    _locks: dict[str, threading.Lock] = field(default_factory=dict)
    _guard: threading.Lock = field(default_factory=threading.Lock)

    def path_of(self, digest: str) -> Path:
        return self.root / digest.removeprefix("sha256:")

    def held(self) -> list[str]:
        """The digests this node holds whole."""
        if not self.root.is_dir():
            return []
        return sorted(f"sha256:{p.name}" for p in self.root.iterdir() if not p.name.startswith("."))

    def ensure(self, object_id: str, digest: str, progress: Progress | None = None) -> Path:
        """The object's directory, fetched first if this node does not hold it."""
        final = self.path_of(digest)
        with self._guard:
            lock = self._locks.setdefault(digest, threading.Lock())
        with lock:  # two workers mounting one object fetch it once
            if final.is_dir():
                os.utime(final)  # its last use, for eviction
                return final
            self.root.mkdir(parents=True, exist_ok=True, mode=0o755)
            manifest = self._manifest(object_id, digest)
            partial = self.root / f".partial-{final.name}"
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(mode=0o755)
            done, total = 0, manifest.size
            for entry in manifest.files:
                try:
                    target = partial / check_relative(entry.path)
                except InvalidInput as exc:
                    raise ObjectUnavailable(exc.message) from None
                target.parent.mkdir(parents=True, exist_ok=True)
                with target.open("wb") as fh:
                    for sha in entry.chunks:
                        data = self._chunk(object_id, sha)
                        fh.write(data)
                        done += len(data)
                        if progress is not None:
                            progress(done, total)
                # readable by the job's user, which holds no uid of the node's: r for all, x as given
                target.chmod((entry.mode & READ_ONLY) | 0o444)
            for directory, dirs, _ in os.walk(partial):
                for name in dirs:
                    os.chmod(os.path.join(directory, name), READ_ONLY)
            partial.chmod(READ_ONLY)
            os.rename(partial, final)
            log.info(
                "object %s cached at %s (%d files, %d bytes)", object_id, final, len(manifest.files), total
            )
            return final

    def _manifest(self, object_id: str, digest: str) -> Manifest:
        for _ in range(FETCH_TRIES):
            data = self.source.manifest(object_id)
            if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
                log.warning(
                    "the manifest of object %s does not match %s: fetching it again", object_id, digest
                )
                continue
            try:
                return Manifest.model_validate_json(data)
            except ValidationError as exc:
                raise ObjectUnavailable(
                    f"object {object_id}: an unreadable manifest ({exc.error_count()} problems)"
                ) from None
        raise ObjectUnavailable(f"object {object_id}: its manifest never matched its digest {digest[:19]}…")

    def _chunk(self, object_id: str, sha256: str) -> bytes:
        for _ in range(FETCH_TRIES):
            data = self.source.chunk(object_id, sha256)
            if hashlib.sha256(data).hexdigest() == sha256:
                return data
            log.warning(
                "chunk %s of object %s does not match its SHA-256: fetching it again", sha256[:12], object_id
            )
        raise ObjectUnavailable(f"object {object_id}: chunk {sha256[:12]}… never matched its SHA-256")
