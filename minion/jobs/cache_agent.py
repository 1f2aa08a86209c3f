"""The desired-state handler for `objects` (contracts/object_cache.py): keep the node's object cache in
line with what the region's live jobs use, and report what it holds.

Every heartbeat answer hands desired["objects"] to CacheAgent.handle, which never waits for a fetch: one
thread fetches the listed objects the cache lacks, one at a time (a storage node filling its region's
cache, or a compute node ahead of its workers), and handle() only hands it the list and reads the
cache's report. An object that cannot be had now (no room, an unreachable control plane) is reported as
waiting with the reason and tried again at the next beat that lists it."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from contracts.object_cache import CacheRole, ObjectsDesired, WantedObject
from minion.jobs.objects import ObjectCache, ObjectUnavailable
from minion.settings import ContainerSettings

log = logging.getLogger(__name__)


def cache_root(settings: ContainerSettings, state_dir: Path, storage: Mapping[str, Any] | None) -> Path:
    """Where the node's objects live. RIGBASE_JOBS_OBJECT_DIR wins; then what finalize made of the node
    (its storage facts, /etc/rigbase/storage.yaml): a storage node's cache export, whose `objects` the
    region's compute nodes see at their data cache mount over NFS, or a compute node's data cache (its
    own drives, or that mount); a node not finalized for real (a lab root) keeps them in its state."""
    if settings.object_dir is not None:
        return settings.object_dir
    if storage and storage.get("applied"):
        export = (storage.get("export") or {}).get("path")
        if storage.get("role") == "storage" and export:
            return Path(str(export)) / "objects"
        return settings.cache_dir / "objects"
    return state_dir / "objects"


@dataclass
class CacheAgent:
    cache: ObjectCache
    root_of: Callable[[], Path] | None = None  # where the cache should be now (cache_root)
    _todo: queue.Queue[WantedObject | None] = field(default_factory=queue.Queue)
    _queued: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None

    def handle(self, value: Any) -> dict[str, Any]:
        if value is None:  # a node without an object cache (a device)
            return self.cache.report().model_dump(mode="json")
        try:
            wanted = ObjectsDesired.model_validate(value)
        except ValidationError as exc:
            log.warning("unreadable objects: %d problem(s); nothing changed", exc.error_count())
            return self.cache.report().model_dump(mode="json")
        if self.root_of is not None and (root := self.root_of()) != self.cache.root:
            self.cache.move_to(root)
        self.cache.role = wanted.role
        self.cache.pinned = {w.digest for w in wanted.objects}
        if wanted.drop and wanted.role is not CacheRole.SHARED:
            self.cache.drop(set(wanted.drop))
        if wanted.role is not CacheRole.SHARED:
            held = set(self.cache.held())
            for w in wanted.objects:
                self._queue(w, held)
        return self.cache.report().model_dump(mode="json")

    def _queue(self, wanted: WantedObject, held: set[str]) -> None:
        with self._lock:
            if wanted.digest in held or wanted.digest in self._queued:
                return
            self._queued.add(wanted.digest)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="object-cache", daemon=True)
                self._thread.start()
        self._todo.put(wanted)

    def _run(self) -> None:
        while (wanted := self._todo.get()) is not None:
            try:
                self.cache.ensure(wanted.object_id, wanted.digest, name=wanted.name)
            except ObjectUnavailable as exc:  # a wait included: reported, tried at the next listing
                log.info("object %s waits: %s", wanted.name or wanted.object_id, exc)
            except Exception:  # one object's failure must not end the only fetching thread
                log.exception("object %s could not be cached", wanted.name or wanted.object_id)
            finally:
                with self._lock:
                    self._queued.discard(wanted.digest)

    def close(self) -> None:
        self._todo.put(None)
