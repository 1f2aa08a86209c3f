"""The regional cache (docs/data.md, "The regional cache"), as the control plane sees it: the heartbeat key
`objects` (contracts/object_cache.py) and what placement and the jobs read of it.

- Contributor: each node's role (by its region's storage mode and its service) and the ready objects
  the region's live jobs use there: on a storage node of a central region, every object a starting or
  running worker anywhere in the region mounts, and the public models and checkpoints its devices'
  configurations mount; on a compute node of a local region, those its own workers mount. A central
  region's compute nodes and devices fetch nothing (role `shared`).
- Reporter: the node's report kept in `nodes.object_cache`, written only when it changed; a storage
  node's report also brings the reason of its region's jobs still waiting for the cache up to date.
- Reads: what a node, or a central region's storage node, holds (placement prefers it) and whether a
  job's objects are all in its region's cache yet (a central region's workers start only then)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import exists, select
from sqlalchemy.orm import Session

from contracts.object_cache import MAX_REPORTED, CacheRole, ObjectsActual, ObjectsDesired, WantedObject
from contracts.regional import StorageMode
from provisioner.domain.states import NODE_STOPPED, WORKER_ON_NODE, ObjectState, Service, WorkerState
from provisioner.services.common import desired_state, node_reports
from provisioner.services.common.errors import flush
from provisioner.store.data_models import DataObject, JobObject
from provisioner.store.expressions import one_of
from provisioner.store.job_models import Job, JobWorker
from provisioner.store.models import Node, Region

log = logging.getLogger("rigbase.objects")

CACHING = "Caching its data in the region"  # a job's reason while its region's storage node fetches


def role_of(node: Node) -> CacheRole | None:
    central = node.region.storage_mode == StorageMode.CENTRAL.value
    if node.service == Service.DEVICE.value:  # devices serve only in central regions: they read its cache
        return CacheRole.SHARED if central else None
    if node.service == Service.STORAGE.value:
        return CacheRole.REGION if central else None
    return CacheRole.SHARED if central else CacheRole.NODE


MOUNTED_READ = "objects.mounted"


def could_mount(node_id: Any) -> Any:
    """Whether a starting or running worker on the node mounts an object (`node_id`: a column it
    correlates to): most nodes' beats skip the read of their objects."""
    return exists().where(
        JobWorker.node_id == node_id,
        one_of(JobWorker.state, [s.value for s in WORKER_ON_NODE]),
        JobObject.job_id == JobWorker.job_id,
    )


def _live_objects(session: Session, *, node_id: str | None = None, region_id: str | None = None) -> Any:
    stmt = (
        select(DataObject)
        .join(JobObject, JobObject.object_id == DataObject.id)
        .join(JobWorker, JobWorker.job_id == JobObject.job_id)
        .where(
            DataObject.state == ObjectState.READY.value,
            JobWorker.state.in_([s.value for s in WORKER_ON_NODE]),
        )
        .distinct()
        .order_by(DataObject.name)
    )
    if node_id is not None:
        stmt = stmt.where(JobWorker.node_id == node_id)
    if region_id is not None:
        stmt = stmt.where(JobWorker.node_id.in_(select(Node.id).where(Node.region_id == region_id)))
    return session.scalars(stmt)


RegionObjects = Callable[[Session, str], list[DataObject]]


def wanted_on(session: Session, node: Node, also: RegionObjects | None = None) -> list[DataObject]:
    """The ready objects this node should hold for the live jobs it caches for; a storage node also those
    `also` names for its region (the models of the configurations deployed to its devices)."""
    role = role_of(node)
    if role is CacheRole.NODE and desired_state.nothing_to_read(session, MOUNTED_READ):
        return []  # the beat's first query found no live worker of the node mounting an object
    if role is CacheRole.REGION:
        listed = {o.id: o for o in _live_objects(session, region_id=node.region_id)}
        for obj in also(session, node.region_id) if also is not None else []:
            listed.setdefault(obj.id, obj)
        return sorted(listed.values(), key=lambda o: o.name)
    if role is CacheRole.NODE:
        return list(_live_objects(session, node_id=node.id))
    return []


def desired_for_node(
    session: Session, node: Node, also: RegionObjects | None = None
) -> dict[str, Any] | None:
    role = role_of(node)
    if role is None:
        return None
    wanted = [
        WantedObject(object_id=o.id, digest=o.digest, size=o.size_bytes or 0, name=o.name)
        for o in wanted_on(session, node, also)
        if o.digest
    ]
    held = held_by(node)  # the copies its last report named: nothing to drop on a node that holds none
    drop = (
        [d for d in recently_removed(session) if d in held] if held and role is not CacheRole.SHARED else []
    )
    return ObjectsDesired(role=role, objects=wanted, drop=drop).model_dump(mode="json")


DROP_WINDOW = timedelta(hours=1)  # a node offline longer than this evicts the copy by LRU instead
_REMOVED: dict[str, tuple[float, list[str]]] = {}  # one answer for every beat of a few seconds
_REMOVED_TTL_S = 10.0
_REMOVED_LOCK = threading.Lock()


def recently_removed(session: Session) -> list[str]:
    """The digests removed from the store within DROP_WINDOW that no live object has."""
    now = time.monotonic()
    with _REMOVED_LOCK:
        held = _REMOVED.get("digests")
        if held is not None and now - held[0] < _REMOVED_TTL_S:
            return held[1]
    live = select(DataObject.digest).where(
        DataObject.state.in_([ObjectState.READY.value, ObjectState.DOWNLOADING.value]),
        DataObject.digest.is_not(None),
    )
    rows = session.scalars(
        select(DataObject.digest)
        .where(
            DataObject.state == ObjectState.REMOVED.value,
            DataObject.digest.is_not(None),
            DataObject.updated_at > datetime.now(UTC) - DROP_WINDOW,
            DataObject.digest.not_in(live),
        )
        .distinct()
        .limit(MAX_REPORTED)
    )
    digests = sorted(d for d in rows if d)
    with _REMOVED_LOCK:
        _REMOVED["digests"] = (now, digests)
    return digests


def record_actual(session: Session, node: Node, value: Any) -> None:
    report = node_reports.read(node, ObjectsActual, value, "an object cache")
    if report is None or not node_reports.store_changed(node, "object_cache", report):
        return
    if report.role is CacheRole.REGION:
        _update_waiting_reasons(session, node, report)
    flush(session, f"node {node.name}")


def held_by(node: Node) -> frozenset[str]:
    return frozenset((node.object_cache or {}).get("held") or ())


def storage_node_of(session: Session, region_id: str) -> Node | None:
    return session.scalar(
        select(Node).where(
            Node.region_id == region_id,
            Node.service == Service.STORAGE.value,
            Node.state.not_in([s.value for s in NODE_STOPPED]),
        )
    )


def region_caches(session: Session) -> dict[str, frozenset[str]]:
    """What each central region's storage node holds, by region id (placement's `holds`)."""
    rows = session.execute(
        select(Node.region_id, Node.object_cache).where(
            Node.service == Service.STORAGE.value, Node.state.not_in([s.value for s in NODE_STOPPED])
        )
    )
    return {str(region): frozenset((cache or {}).get("held") or ()) for region, cache in rows}


def digests_of(session: Session, job_id: str) -> frozenset[str]:
    stmt = select(DataObject.digest).join(JobObject, JobObject.object_id == DataObject.id)
    return frozenset(d for d in session.scalars(stmt.where(JobObject.job_id == job_id)) if d)


def missing_in_region(session: Session, job: Job) -> tuple[Node | None, list[DataObject]]:
    """In a central region: its storage node and the job's objects it does not hold yet; (None, []) in a
    local region, where each node fetches what its workers mount."""
    region = session.get(Region, job.region_id) if job.region_id else None
    if region is None or region.storage_mode != StorageMode.CENTRAL.value:
        return None, []
    storage = storage_node_of(session, region.id)
    return storage, _not_held(session, job.id, held_by(storage) if storage is not None else frozenset())


def _not_held(session: Session, job_id: str, held: frozenset[str]) -> list[DataObject]:
    """The job's objects whose digest is not in `held`, by name."""
    stmt = select(DataObject).join(JobObject, JobObject.object_id == DataObject.id)
    objects = session.scalars(stmt.where(JobObject.job_id == job_id).order_by(DataObject.name))
    return [o for o in objects if o.digest not in held]


def caching_reason(storage: Node | None, missing: Iterable[DataObject]) -> str:
    listed = list(missing)
    report = (storage.object_cache or {}) if storage is not None else {}
    fetching = {f["digest"]: f for f in report.get("fetching") or ()}
    waits = {w["digest"]: w["reason"] for w in report.get("waiting") or ()}
    parts = []
    for obj in listed:
        if obj.digest in waits:
            parts.append(f"{obj.kind} {obj.name!r}: {waits[obj.digest]}")
        elif obj.digest in fetching:
            f = fetching[obj.digest]
            parts.append(f"{obj.kind} {obj.name!r} {f['done'] * 100 // max(f['total'], 1)} %")
        else:
            parts.append(f"{obj.kind} {obj.name!r} queued")
    where = f"storage node {storage.name}" if storage is not None else "its storage node (none is active)"
    return f"{CACHING} ({where}): " + "; ".join(parts)


def _update_waiting_reasons(session: Session, storage: Node, report: ObjectsActual) -> None:
    """The reason of each job of the region whose workers wait for the region's cache, kept current."""
    jobs = session.scalars(
        select(Job)
        .join(JobWorker, JobWorker.job_id == Job.id)
        .where(Job.region_id == storage.region_id, JobWorker.state == WorkerState.STARTING.value)
        .distinct()
    )
    held = frozenset(report.held)
    for job in jobs:
        missing = _not_held(session, job.id, held)
        reason = caching_reason(storage, missing) if missing else None
        if reason is not None and reason != job.reason:
            job.reason = reason
        elif reason is None and (job.reason or "").startswith(CACHING):
            job.reason = "its data is in the region's cache: starting"
