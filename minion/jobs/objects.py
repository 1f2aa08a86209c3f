"""The node's cache of datasets, models and checkpoints, fetched by digest (docs/data.md, "On the node").

A worker's object mount names the object and the digest of its manifest. The cache keeps each object
once, at ROOT/HEX (HEX: the digest's hex), however many workers mount it. A missing one is fetched over
the minion's outbound connection with the node credential: the manifest first, checked against the
digest, then every chunk, each checked against its SHA-256. A byte that does not match is refused and
fetched again (FETCH_TRIES times); the object is built under ROOT/.partial-HEX and renamed into place
only when whole, so a half-fetched object is never mounted. Files are read-only (no write or set-id
bits) and their paths are the manifest's relative ones, checked again here.

The cache keeps within a budget (the volume's size less a reserve, or RIGBASE_JOBS_OBJECT_CACHE_GB). To
make room for an object it evicts the least recently used ones, never one a worker of this node mounts
(`busy`) or one the control plane lists for the region's live jobs (`pinned`); when that is not enough the
fetch waits (CacheFull says why) and nothing is evicted. A `shared` cache (a compute node of a central
region: the storage node's export) fetches nothing and evicts nothing (contracts/object_cache.py)."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

import httpx
from pydantic import ValidationError

from contracts.data_objects import CHUNK_ROUTE, MANIFEST_ROUTE, Manifest, check_relative
from contracts.errors import InvalidInput
from contracts.object_cache import MAX_REPORTED, CacheRole, CacheWait, Fetching, ObjectsActual
from minion.join.client import ConnectionProblem, ControlPlane

log = logging.getLogger(__name__)

FETCH_TRIES: Final = 3
DIRECT_TIMEOUT_S: Final = 60.0
READ_ONLY: Final = 0o555  # the most a cached file or directory may be: no write, no set-id
RESERVE: Final = 0.05  # of the cache's volume, never filled (its filesystem and the node's logs need it)
GB: Final = 10**9


class ObjectUnavailable(Exception):
    """The object cannot be fetched now; the message says why."""


class ObjectWait(ObjectUnavailable):
    """The object cannot be had yet, and waiting helps: the worker waits and tries again."""


class CacheFull(ObjectWait):
    """No room for the object without evicting what a job uses."""


class NotInRegionCache(ObjectWait):
    """A shared cache (the region's, read over NFS) does not hold it yet: the storage node fetches it."""


class ObjectSource(Protocol):
    def manifest(self, object_id: str) -> bytes: ...

    def chunk(self, object_id: str, sha256: str) -> bytes: ...


@dataclass
class ControlPlaneObjects:
    """ObjectSource over the minion's own outbound connection, with the node credential."""

    cp: ControlPlane
    node: Callable[[], dict[str, Any]]
    direct_bytes: int = 0  # read straight from the bucket, through pre-signed URLs

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
        """Through the control plane, or straight from its bucket when it answers with a pre-signed URL
        (307); a URL this node cannot read falls back to the control plane."""
        path = CHUNK_ROUTE.replace("{object_id}", object_id).replace("{chunk}", sha256)
        node = self.node()
        try:
            answer = self.cp.get(path.format(node_id=node["node_id"]), token=node["node_credential"])
        except ConnectionProblem as exc:
            raise ObjectUnavailable(str(exc)) from None
        if answer.status_code == 307 and (url := answer.headers.get("location")):
            try:  # a plain GET: the URL is the credential, the node's own must not go to the bucket
                direct = httpx.get(url, timeout=DIRECT_TIMEOUT_S)
                if direct.status_code == 200:
                    self.direct_bytes += len(direct.content)
                    return direct.content
                log.warning("the bucket answered HTTP %d for chunk %s", direct.status_code, sha256[:12])
            except httpx.HTTPError as exc:
                log.warning("the bucket could not be read for chunk %s (%s)", sha256[:12], exc)
            return self._get(path + "?direct=false")
        if answer.status_code != 200:
            raise ObjectUnavailable(
                f"the control plane answered HTTP {answer.status_code}: {answer.text[:200]}"
            )
        return answer.content


Progress = Callable[[int, int], None]  # bytes fetched, bytes of the object


@dataclass
class ObjectCache:
    root: Path
    source: ObjectSource
    role: CacheRole = CacheRole.NODE
    budget_bytes: int | None = None  # None: the volume's size less RESERVE
    busy: Callable[[], set[str]] = set  # digests a worker of this node mounts
    pinned: set[str] = field(default_factory=set)  # digests the control plane listed for live jobs
    _locks: dict[str, threading.Lock] = field(default_factory=dict)
    _guard: threading.Lock = field(default_factory=threading.Lock)
    _sizes: dict[str, int] | None = None  # held digest → bytes, read from the disk once
    _fetching: dict[str, tuple[int, int]] = field(default_factory=dict)
    _waiting: dict[str, str] = field(default_factory=dict)

    def path_of(self, digest: str) -> Path:
        return self.root / digest.removeprefix("sha256:")

    def held(self) -> list[str]:
        """The digests this node holds whole."""
        return sorted(self._held())

    def _held(self) -> dict[str, int]:
        with self._guard:
            if self._sizes is None:
                self._sizes = {
                    f"sha256:{p.name}": _size_of(p)
                    for p in (self.root.iterdir() if self.root.is_dir() else ())
                    if not p.name.startswith(".") and p.is_dir()
                }
            if self.role is CacheRole.SHARED:  # another node fills it: what it holds is what is there
                there = {
                    f"sha256:{p.name}"
                    for p in (self.root.iterdir() if self.root.is_dir() else ())
                    if not p.name.startswith(".")
                }
                self._sizes = {d: self._sizes.get(d) or _size_of(self.path_of(d)) for d in there}
            return dict(self._sizes)

    def move_to(self, root: Path) -> None:
        """Keep objects under `root` from now on (what is held elsewhere is fetched again as needed)."""
        with self._guard:
            log.info("object cache: %s (was %s)", root, self.root)
            self.root, self._sizes = root, None

    def drop(self, digests: set[str]) -> list[str]:
        """Delete the copies of these objects (removed from the store), but not one a worker here mounts
        or the control plane lists; the digests dropped."""
        keep = self.busy() | self.pinned
        dropped = []
        for digest in sorted(digests - keep):
            with self._guard:
                lock = self._locks.setdefault(digest, threading.Lock())
            with lock:
                if self.path_of(digest).is_dir():
                    _remove(self.path_of(digest))
                    dropped.append(digest)
                with self._guard:
                    if self._sizes is not None:
                        self._sizes.pop(digest, None)
        if dropped:
            log.info("dropped %d object(s) removed from the store", len(dropped))
        return dropped

    def budget(self) -> int:
        if self.budget_bytes is not None:
            return self.budget_bytes
        vfs = os.statvfs(self.root if self.root.is_dir() else self.root.parent)
        return int(vfs.f_blocks * vfs.f_frsize * (1 - RESERVE))

    def report(self) -> ObjectsActual:
        """What this cache holds, fetches and waits for (the heartbeat's `objects`)."""
        held = self._held()
        recent = sorted(held, key=lambda d: _mtime(self.path_of(d)), reverse=True)[:MAX_REPORTED]
        with self._guard:
            fetching = [Fetching(digest=d, done=a, total=b) for d, (a, b) in self._fetching.items()]
            waiting = [CacheWait(digest=d, reason=r[:1000]) for d, r in self._waiting.items()]
        return ObjectsActual(
            role=self.role,
            held=sorted(recent),
            used_bytes=sum(held.values()),
            budget_bytes=self.budget() if self.root.parent.exists() else 0,
            fetching=fetching[:MAX_REPORTED],
            waiting=waiting[:MAX_REPORTED],
        )

    def ensure(
        self, object_id: str, digest: str, progress: Progress | None = None, *, name: str = ""
    ) -> Path:
        """The object's directory, fetched first if this node does not hold it (CacheFull: no room)."""
        final = self.path_of(digest)
        with self._guard:
            lock = self._locks.setdefault(digest, threading.Lock())
        with lock:  # two workers mounting one object fetch it once
            if final.is_dir():
                os.utime(final)  # its last use, for eviction
                with self._guard:
                    self._waiting.pop(digest, None)
                return final
            if self.role is CacheRole.SHARED:
                raise NotInRegionCache(
                    f"{name or object_id} is not in the region's cache yet: the region's storage node "
                    "fetches it (provision node show STORAGE-NODE says how far)"
                )
            self.root.mkdir(parents=True, exist_ok=True, mode=0o755)
            try:
                manifest = self._manifest(object_id, digest)
                self._make_room(digest, manifest.size, name or object_id)
                self._fetch(object_id, digest, manifest, final, progress)
            except ObjectUnavailable as exc:  # reported (the heartbeat's `waiting`) until it is had
                with self._guard:
                    self._waiting[digest] = str(exc)
                raise
            finally:
                with self._guard:
                    self._fetching.pop(digest, None)
            with self._guard:
                self._waiting.pop(digest, None)
                if self._sizes is not None:
                    self._sizes[digest] = manifest.size
            return final

    def _fetch(
        self, object_id: str, digest: str, manifest: Manifest, final: Path, progress: Progress | None
    ) -> None:
        partial = self.root / f".partial-{final.name}"
        _remove(partial)
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
                    with self._guard:
                        self._fetching[digest] = (done, total)
                    if progress is not None:
                        progress(done, total)
            # readable by the job's user, which holds no uid of the node's: r for all, x as given
            target.chmod((entry.mode & READ_ONLY) | 0o444)
        for directory, dirs, _ in os.walk(partial):
            for name in dirs:
                os.chmod(os.path.join(directory, name), READ_ONLY)
        partial.chmod(READ_ONLY)
        os.rename(partial, final)
        log.info("object %s cached at %s (%d files, %d bytes)", object_id, final, len(manifest.files), total)

    def _make_room(self, digest: str, need: int, what: str) -> None:
        """Evict least recently used objects no job uses until `need` bytes fit; CacheFull otherwise."""
        held = self._held()
        keep = self.busy() | self.pinned | {digest}
        budget = self.budget()

        def room() -> int:
            vfs = os.statvfs(self.root)
            free = vfs.f_bavail * vfs.f_frsize - int(vfs.f_blocks * vfs.f_frsize * RESERVE)
            return min(budget - sum(held.values()), free)

        for victim in sorted((d for d in held if d not in keep), key=lambda d: _mtime(self.path_of(d))):
            if room() >= need:
                break
            log.info("evicting object %s (%d bytes, least recently used) for %s", victim, held[victim], what)
            _remove(self.path_of(victim))
            del held[victim]
            with self._guard:
                if self._sizes is not None:
                    self._sizes.pop(victim, None)
        left = room()
        if left < need:
            raise CacheFull(
                f"waiting for room in the node's object cache: {what} needs {_human(need)}, "
                f"{_human(max(left, 0))} is free of its {_human(budget)} budget and the rest holds "
                "objects that jobs use (it is fetched once they end)"
            )

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


def _human(n: int) -> str:
    return f"{n / GB:.1f} GB" if n >= GB else f"{n / 10**6:.1f} MB"


def _size_of(path: Path) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return time.time()


def _remove(path: Path) -> None:
    """A cached object's directory gone, read-only as it is: renamed out of sight first, so no mount
    finds it half-removed."""
    if not path.exists():
        return
    doomed = path.with_name(f".evicted-{path.name}-{os.urandom(4).hex()}")
    os.rename(path, doomed)
    for directory, _, _ in os.walk(doomed):
        os.chmod(directory, 0o755)
    shutil.rmtree(doomed, ignore_errors=True)
