"""Datasets, models and checkpoints: a project's persistent data (docs/data.md).

An object is created `downloading` with its source. A remote source (s3://, gs://, https://, git+https://) is
read by the ingest reconciler (provisioner/reconcilers/objects.py) into the object store; a local file or
directory is uploaded by the CLI, chunk by chunk, and finished with its manifest. Either way the object
becomes `ready`, with its digest, size and file count, and is immutable from then on; or `failed`, with one
line that says why. Nothing is marked ready before every chunk its manifest names is in the store.

An object is its project's. Jobs of that project mount it by name; a public object (created by a root
admin) is readable by every account. Another account's private object answers as a missing one."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import threading
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import ColumnElement, func, or_, select
from sqlalchemy.orm import Session, sessionmaker

from contracts.data_objects import (
    CHUNK_BYTES,
    SHA256_HEX,
    Manifest,
    ObjectKind,
    Source,
    SourceScheme,
    check_name,
    parse_source,
)
from contracts.errors import Conflict, InvalidInput, NotFound, RuleViolation
from contracts.object_cache import CacheRole
from contracts.object_tree import scan
from provisioner.adapters.object_store import check_held, chunk_key, manifest_key
from provisioner.adapters.sources import Credentials, Networks, SourceError, fetch, networks_of
from provisioner.domain.key_kinds import DEFAULT_NAME, KeyKind
from provisioner.domain.roles import Action, Principal
from provisioner.domain.states import JOB_LIVE, OBJECT_TRANSITIONS, ObjectState
from provisioner.services.accounts import accounts, project_keys
from provisioner.services.common import lifecycle
from provisioner.services.common.runtime import runtime_of
from provisioner.services.common.wakeups import Wake, wake_after_commit
from provisioner.services.objects import node_caches
from provisioner.store.account_models import Project
from provisioner.store.data_models import DataObject, JobObject, JobOutput
from provisioner.store.engine import session_scope
from provisioner.store.job_models import Job
from provisioner.store.models import Node, new_id

GB = 10**9
UPLOAD_PREFIX = "upload:"  # an uploaded object's source: the path the CLI read, for the record only


def transition(
    session: Session, obj: DataObject, to: ObjectState, *, actor: str, reason: str | None = None
) -> None:
    lifecycle.apply(
        session, obj, to, kind=obj.kind, name=obj.name, table=OBJECT_TRANSITIONS, actor=actor, reason=reason
    )


def _kind(kind: str) -> ObjectKind:
    try:
        return ObjectKind(kind)
    except ValueError:
        raise InvalidInput(
            f"object kind {kind!r}: use one of {', '.join(k.value for k in ObjectKind)}", code="invalid_kind"
        ) from None


def _live() -> ColumnElement[bool]:
    return DataObject.state != ObjectState.REMOVED.value


def _quota(session: Session, project_id: str) -> int:
    used = session.scalar(
        select(func.coalesce(func.sum(DataObject.size_bytes), 0)).where(
            DataObject.project_id == project_id, _live()
        )
    )
    return int(runtime_of(session).settings.storage_quota_gb * GB) - int(used or 0)


def _credentials(session: Session, project_id: str, source: Source, key: str | None) -> Credentials | None:
    """The project key a source is read with: the one named, else the kind's `default` if the project has
    it (else anonymous, for a public bucket)."""
    kind = source.key_kind
    if kind is None:
        if key:
            raise InvalidInput(f"{source.scheme}:// sources take no key: leave out --key", code="invalid_key")
        return None
    name = key or DEFAULT_NAME
    found = project_keys.secret_of(session, project_id, KeyKind(kind), name)
    if found is None:
        if key:
            raise NotFound(
                f"the project has no {kind} key {name!r}: add it with "
                f"`provision project key set --kind {kind} --name {name}`",
                code="key_not_found",
            )
        return None
    return Credentials(f"{kind}/{name}", *found)


def create(
    session: Session,
    principal: Principal,
    kind: str,
    name: str,
    source: str,
    *,
    project: str | None = None,
    endpoint_url: str | None = None,
    key: str | None = None,
    public: bool = False,
) -> DataObject:
    """A new object, `downloading`; a remote source is read by the ingest reconciler after commit."""
    principal.require(Action.RUN_JOBS)
    known = _kind(kind)
    check_name(known, name)
    parsed = parse_source(source)
    if public and not principal.is_fleet_admin:
        raise RuleViolation(
            "only the root account's admins create public objects: leave out --public",
            code="forbidden_public",
        )
    if endpoint_url is not None and parsed.scheme not in (SourceScheme.S3, SourceScheme.AZURE):
        raise InvalidInput(
            "--endpoint-url is for s3:// and azure:// sources only (an S3-compatible store, a blob endpoint)",
            code="invalid_source",
        )
    proj = accounts.project_for(session, principal, project)
    taken = session.scalar(
        select(DataObject).where(
            DataObject.project_id == proj.id, DataObject.kind == known.value, DataObject.name == name, _live()
        )
    )
    if taken is not None:
        raise Conflict(
            f"{known} {name!r} is already {taken.state} in project {proj.name}: choose another name, or "
            f"`provision {known} remove {name}` first",
            code="duplicate_name",
        )
    _credentials(session, proj.id, parsed, key)  # a key named but missing is refused now
    stored = source if parsed.scheme is not SourceScheme.UPLOAD else UPLOAD_PREFIX + source
    obj = _new(
        session, principal, proj, known, name, stored, endpoint_url=endpoint_url, key=key, public=public
    )
    if parsed.scheme is not SourceScheme.UPLOAD:
        wake_after_commit(session, Wake.OBJECTS)
    return obj


def _new(
    session: Session,
    principal: Principal,
    project: Project,
    kind: ObjectKind,
    name: str,
    source: str,
    *,
    endpoint_url: str | None,
    key: str | None,
    public: bool = False,
) -> DataObject:
    """A new object of the project, downloading (its first audit line says from where)."""
    obj = DataObject(
        id=new_id("obj"),  # set now: its first audit line is written before the flush
        project_id=project.id,
        account_id=project.account_id,
        kind=kind.value,
        name=name,
        source=source,
        endpoint_url=endpoint_url,
        key_name=key,
        public=public,
        size_bytes=0,
        file_count=0,
        created_by=principal.actor,
    )
    session.add(obj)
    transition(session, obj, ObjectState.DOWNLOADING, actor=principal.actor, reason=f"from {source}")
    return obj


def _visible(principal: Principal, project_id: str | None) -> ColumnElement[bool]:
    mine = (
        DataObject.project_id == project_id if project_id else DataObject.account_id == principal.account_id
    )
    return or_(mine, DataObject.public.is_(True))


def get(
    session: Session, principal: Principal, kind: str, ref: str, *, project: str | None = None
) -> DataObject:
    """By id, or by name in the project (the default one) and then among the public objects."""
    known = _kind(kind)
    proj = accounts.project_for(session, principal, project)
    rows = session.scalars(
        select(DataObject)
        .where(DataObject.kind == known.value, _live(), or_(DataObject.id == ref, DataObject.name == ref))
        .where(_visible(principal, proj.id) if not principal.is_fleet_admin else DataObject.id.is_not(None))
        .order_by((DataObject.project_id == proj.id).desc(), DataObject.public.desc())
    ).all()
    for row in rows:
        if row.id == ref or row.project_id == proj.id or row.public:
            return row
    raise NotFound(
        f"{known} {ref!r} does not exist in project {proj.name}: see `provision {known} list`, or create it "
        f"with `provision {known} create {ref} --source SRC`",
        code="object_not_found",
    )


def list_objects(
    session: Session, principal: Principal, kind: str, *, project: str | None = None
) -> list[DataObject]:
    known = _kind(kind)
    proj = accounts.project_for(session, principal, project)
    stmt = (
        select(DataObject)
        .where(DataObject.kind == known.value, _live(), _visible(principal, proj.id))
        .order_by(DataObject.public, DataObject.name)
    )
    return list(session.scalars(stmt))


def users_of(session: Session, obj: DataObject) -> list[str]:
    """The names of the waiting, starting or running jobs that mount it."""
    stmt = (
        select(Job.name)
        .join(JobObject, JobObject.job_id == Job.id)
        .where(JobObject.object_id == obj.id, Job.state.in_([s.value for s in JOB_LIVE]))
        .order_by(Job.name)
    )
    return list(session.scalars(stmt))


def _own(principal: Principal, obj: DataObject) -> None:
    if obj.account_id != principal.account_id and not principal.is_fleet_admin:
        raise RuleViolation(
            f"{obj.kind} {obj.name!r} is public and not this account's: it can be read, not changed",
            code="not_owner",
        )


def remove(
    session: Session, principal: Principal, kind: str, ref: str, *, project: str | None = None
) -> DataObject:
    """Refused while a live job mounts it (the jobs named). The bytes stay while another live object of
    the project has the same digest."""
    principal.require(Action.RUN_JOBS)
    obj = get(session, principal, kind, ref, project=project)
    _own(principal, obj)
    jobs = users_of(session, obj)
    if jobs:
        shown = ", ".join(jobs[:5]) + (f" and {len(jobs) - 5} more" if len(jobs) > 5 else "")
        raise RuleViolation(
            f"{obj.kind} {obj.name!r} is mounted by job(s) {shown}: stop them first", code="object_in_use"
        )
    digest = obj.digest
    transition(session, obj, ObjectState.REMOVED, actor=principal.actor, reason="removed")
    _forget_bytes(session, obj.project_id, digest)
    return obj


def _forget_bytes(session: Session, project_id: str, digest: str | None) -> int:
    """After an object of `digest` was removed: its manifest and every chunk no other live object or kept
    job output of the project names, deleted from the store; how many chunks. Nothing while another live
    object has the same digest. An upload in progress that counted on a deleted chunk is told it is
    missing when it finishes, and the same command sends it again."""
    if digest is None:
        return 0
    same = session.scalar(
        select(func.count()).where(DataObject.project_id == project_id, DataObject.digest == digest, _live())
    )
    if same:
        return 0
    store = runtime_of(session).objects()
    try:
        gone = Manifest.model_validate_json(store.get(manifest_key(project_id, digest))).chunk_set()
    except KeyError:
        return 0
    others = session.scalars(
        select(DataObject).where(DataObject.project_id == project_id, DataObject.digest.is_not(None), _live())
    )
    for other in others:
        gone -= _chunks_of(session, other)
    kept = session.scalars(
        select(JobOutput.digest).where(JobOutput.project_id == project_id, JobOutput.digest.is_not(None))
    )
    for out_digest in set(kept):
        try:
            gone -= Manifest.model_validate_json(store.get(manifest_key(project_id, out_digest))).chunk_set()
        except KeyError:
            continue
    store.delete(manifest_key(project_id, digest))
    for sha in gone:
        store.delete(chunk_key(project_id, sha))
    return len(gone)


# ------------------------------------------------------------------------------- reading and writing bytes


def manifest_of(session: Session, obj: DataObject) -> Manifest:
    if obj.digest is None:
        raise RuleViolation(f"{obj.kind} {obj.name!r} is {obj.state}, not ready", code="object_not_ready")
    data = runtime_of(session).objects().get(manifest_key(obj.project_id, obj.digest))
    return Manifest.model_validate_json(data)


def _uploading(session: Session, principal: Principal, object_id: str) -> DataObject:
    obj = session.get(DataObject, object_id)
    if obj is None or obj.account_id != principal.account_id or obj.state == ObjectState.REMOVED:
        raise NotFound(
            f"object {object_id!r} does not exist: see `provision dataset list`", code="object_not_found"
        )
    if obj.state != ObjectState.DOWNLOADING or not obj.source.startswith(UPLOAD_PREFIX):
        raise RuleViolation(
            f"{obj.kind} {obj.name!r} is {obj.state} and takes no upload: create a new one",
            code="not_uploading",
        )
    return obj


def missing_chunks(session: Session, principal: Principal, object_id: str, chunks: list[str]) -> list[str]:
    """Which of `chunks` the store does not hold for the object's project: what an upload still sends."""
    obj = _uploading(session, principal, object_id)
    store = runtime_of(session).objects()
    bad = [c for c in chunks if not SHA256_HEX.fullmatch(c)]
    if bad:
        raise InvalidInput(f"chunk {bad[0][:80]!r} is not a SHA-256 in lowercase hex", code="invalid_chunk")
    return [c for c in dict.fromkeys(chunks) if not store.has(chunk_key(obj.project_id, c))]


def put_chunk(session: Session, principal: Principal, object_id: str, sha256: str, data: bytes) -> None:
    obj = _uploading(session, principal, object_id)
    if len(data) > CHUNK_BYTES:
        raise InvalidInput(f"a chunk is at most {CHUNK_BYTES} bytes", code="invalid_chunk")
    if hashlib.sha256(data).hexdigest() != sha256:
        raise InvalidInput(
            "the chunk's bytes do not match its SHA-256: send it again", code="digest_mismatch"
        )
    runtime_of(session).objects().put(chunk_key(obj.project_id, sha256), data)


def finish_upload(session: Session, principal: Principal, object_id: str, manifest: Manifest) -> DataObject:
    """Ready, once every chunk the manifest names is stored and it fits the quota."""
    obj = _uploading(session, principal, object_id)
    store = runtime_of(session).objects()
    why = check_held(store, obj.project_id, manifest)
    if why is not None:
        raise RuleViolation(why, code="chunks_missing")
    _fits(session, obj, manifest.size)
    mark_ready(session, obj, manifest, actor=principal.actor)
    return obj


def _fits(session: Session, obj: DataObject, size: int) -> None:
    left = _quota(session, obj.project_id)
    if size > left:
        raise RuleViolation(
            f"{obj.kind} {obj.name!r} is {size / GB:.3g} GB, more than the {max(left, 0) / GB:.3g} GB "
            "left of the project's storage quota: remove objects, or ask for a larger "
            "RIGBASE_STORAGE_QUOTA_GB",
            code="over_quota",
        )


def mark_ready(session: Session, obj: DataObject, manifest: Manifest, *, actor: str) -> None:
    """Ready, with the manifest stored: the caller has checked every chunk it names is held."""
    digest = manifest.digest()
    runtime_of(session).objects().put(manifest_key(obj.project_id, digest), manifest.canonical())
    obj.digest, obj.size_bytes, obj.file_count = digest, manifest.size, len(manifest.files)
    obj.ready_at = datetime.now(UTC)
    wake_after_commit(session, Wake.JOBS)  # a job waiting for it may start now
    transition(
        session, obj, ObjectState.READY, actor=actor, reason=f"{len(manifest.files)} file(s), {digest[:19]}"
    )


# ------------------------------------------------------------------------------- ingest of remote sources


@dataclass(frozen=True)
class Pending:
    id: str
    project_id: str
    source: Source
    endpoint_url: str | None
    credentials: Credentials | None
    limit: int
    allowed: Networks


def pending(session: Session, limit: int = 8) -> list[Pending]:
    """Remote-source objects still downloading, oldest first."""
    rows = session.scalars(
        select(DataObject)
        .where(
            DataObject.state == ObjectState.DOWNLOADING.value, ~DataObject.source.startswith(UPLOAD_PREFIX)
        )
        .order_by(DataObject.created_at)
        .limit(limit)
    ).all()
    out = []
    for row in rows:
        source = parse_source(row.source)
        try:
            creds = _credentials(session, row.project_id, source, row.key_name)
        except NotFound as exc:  # the key was removed since the object was created
            transition(session, row, ObjectState.FAILED, actor="rigbase:objects", reason=exc.message)
            continue
        allowed = networks_of(runtime_of(session).settings.source_networks)
        left = _quota(session, row.project_id)
        out.append(Pending(row.id, row.project_id, source, row.endpoint_url, creds, left, allowed))
    return out


def ingest(sessions: sessionmaker[Session], job: Pending, work_dir: Path) -> None:
    """Read one remote source into the store and mark its object ready, or failed with the reason."""
    scratch = Path(tempfile.mkdtemp(prefix="ingest-", dir=work_dir))
    try:
        dest = scratch / "content"
        dest.mkdir()
        reason: str | None = None
        try:
            fetch(
                job.source,
                dest,
                credentials=job.credentials,
                endpoint_url=job.endpoint_url,
                limit=job.limit,
                allowed=job.allowed,
            )
            tree = scan(dest)
            with session_scope(sessions) as session:
                store = runtime_of(session).objects()
            for sha, piece in tree.pieces.items():
                key = chunk_key(job.project_id, sha)
                if not store.has(key):
                    store.put(key, piece.read())
        except (SourceError, InvalidInput) as exc:
            reason = str(exc) if isinstance(exc, SourceError) else exc.message
        with session_scope(sessions) as session:
            obj = session.get(DataObject, job.id)
            if obj is None or obj.state != ObjectState.DOWNLOADING:
                return  # removed while it was read
            if reason is None and not tree.manifest.files:
                reason = f"{job.source.uri}: nothing to store (no regular files)"
            if reason is None:
                try:
                    _fits(session, obj, tree.manifest.size)
                except RuleViolation as exc:
                    reason = exc.message
            if reason is not None:
                transition(session, obj, ObjectState.FAILED, actor="rigbase:objects", reason=reason[:1000])
                wake_after_commit(session, Wake.JOBS)  # a job waiting for it fails now
            else:
                mark_ready(session, obj, tree.manifest, actor="rigbase:objects")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def project_name(session: Session, obj: DataObject) -> str:
    project = session.get(Project, obj.project_id)
    return project.name if project is not None else obj.project_id


# ------------------------------------------------------------------------------- nodes fetching objects


def for_node(session: Session, node_id: str, credential: str | None, object_id: str) -> DataObject:
    """The object, if a worker placed on this node (a central region's storage node: on any node of its
    region), starting or running, belongs to a job that mounts it, or, for a storage node, if it is public
    (its devices' configurations mount those); NotFound otherwise, the same answer whether the object
    exists or not."""
    from provisioner.domain.states import WORKER_ON_NODE
    from provisioner.services.fleet import node_credentials
    from provisioner.store.job_models import JobWorker

    node, _ = node_credentials.node_for_credential(session, node_id, credential)
    # a central region's storage node fetches for every node of its region (node_caches)
    region = node_caches.role_of(node) is CacheRole.REGION
    if region:  # the fleet's public models and checkpoints, which its devices' configurations mount
        public = session.scalar(
            select(DataObject).where(
                DataObject.id == object_id, DataObject.public.is_(True), DataObject.state == ObjectState.READY
            )
        )
        if public is not None:
            return public
    where = (
        JobWorker.node_id.in_(select(Node.id).where(Node.region_id == node.region_id))
        if region
        else JobWorker.node_id == node.id
    )
    mounted = session.scalar(
        select(DataObject)
        .join(JobObject, JobObject.object_id == DataObject.id)
        .join(JobWorker, JobWorker.job_id == JobObject.job_id)
        .where(
            DataObject.id == object_id,
            DataObject.state == ObjectState.READY.value,
            where,
            JobWorker.state.in_([s.value for s in WORKER_ON_NODE]),
        )
        .limit(1)
    )
    if mounted is None:
        raise NotFound(f"no worker on this node mounts object {object_id!r}", code="object_not_here")
    return mounted


# a ready object's chunks by (project, digest): a node fetching an object asks once per chunk, and reading a
# manifest of many files for each would cost more than the chunk (a ready object never changes)
_CHUNK_SETS: OrderedDict[tuple[str, str], frozenset[str]] = OrderedDict()
_CHUNK_SETS_HELD = 64


_CHUNK_SETS_LOCK = threading.Lock()  # the API's handlers run in a thread pool


def _chunks_of(session: Session, obj: DataObject) -> frozenset[str]:
    key = (obj.project_id, obj.digest or "")
    with _CHUNK_SETS_LOCK:
        held = _CHUNK_SETS.get(key)
        if held is not None:
            _CHUNK_SETS.move_to_end(key)
            return held
    held = frozenset(manifest_of(session, obj).chunk_set())
    with _CHUNK_SETS_LOCK:
        _CHUNK_SETS[key] = held
        while len(_CHUNK_SETS) > _CHUNK_SETS_HELD:
            _CHUNK_SETS.popitem(last=False)
    return held


PRESIGNED_S = 300  # how long a chunk's pre-signed URL reads: one chunk's fetch, with retries


def chunk_for_node(session: Session, obj: DataObject, sha256: str, *, direct: bool = True) -> bytes | str:
    """One chunk's bytes, or (`direct`, the store offers them and the setting allows) a short-lived
    pre-signed URL the node reads it from straight from the bucket."""
    if sha256 not in _chunks_of(session, obj):
        raise NotFound(f"object {obj.id!r} has no chunk {sha256[:16]}…", code="chunk_not_found")
    runtime = runtime_of(session)
    key = chunk_key(obj.project_id, sha256)
    if direct and runtime.settings.object_store_presign:
        url = runtime.objects().presign(key, PRESIGNED_S)
        if url is not None:
            return url
    return runtime.objects().get(key)


# ------------------------------------------------------------------------------- jobs mounting objects

ROLE_KIND = {"dataset": ObjectKind.DATASET, "model": ObjectKind.MODEL, "checkpoint": ObjectKind.CHECKPOINT}


def for_job(
    session: Session, project_id: str, mounts: list[tuple[str, str, str]]
) -> list[tuple[DataObject, str]]:
    """The objects a new job mounts: (role, name, target) → (object, target), each by name in the job's
    project, else among the public ones. Refused in one line, nothing stored, for a name that is not there
    and for a failed one; one still downloading is taken (the job waits for it: waiting_for)."""
    out: list[tuple[DataObject, str]] = []
    for role, name, target in mounts:
        kind = ROLE_KIND[role]
        rows = session.scalars(
            select(DataObject)
            .where(
                DataObject.kind == kind.value, or_(DataObject.name == name, DataObject.id == name), _live()
            )
            .where(or_(DataObject.project_id == project_id, DataObject.public.is_(True)))
            .order_by((DataObject.project_id == project_id).desc())
        ).all()
        if not rows:
            raise NotFound(
                f"{kind} {name!r} does not exist in the job's project: create it with "
                f"`provision {kind} create {name} --source PATH|URI`, or see `provision {kind} list`",
                code="object_not_found",
            )
        obj = rows[0]
        if obj.state == ObjectState.FAILED:
            raise RuleViolation(
                f"{kind} {name!r} is failed ({obj.reason}): remove it and create it again",
                code="object_not_ready",
            )
        out.append((obj, target))
    return out


def link(session: Session, job_id: str, objects: list[tuple[DataObject, str]]) -> None:
    for obj, target in objects:
        session.add(JobObject(job_id=job_id, object_id=obj.id, target=target))


def mounted_by(session: Session, job_id: str) -> dict[str, DataObject]:
    """A job's objects by the target they mount at."""
    stmt = select(JobObject.target, DataObject).join(DataObject, DataObject.id == JobObject.object_id)
    return {target: obj for target, obj in session.execute(stmt.where(JobObject.job_id == job_id))}


WAITING_FOR_DATA = "Waiting for data"


def waiting_for(session: Session, job_id: str, disk_gb: int | None = None) -> tuple[str | None, str | None]:
    """(why the job waits for its data, why it cannot have it): a dataset, model or checkpoint still
    downloading, or one that failed (or was removed) since the job was created, or an inference input
    larger than the worker's disk (`disk_gb`, resources.disk_size: the input counts against it);
    (None, None) when all are ready."""
    stmt = select(DataObject).join(JobObject, JobObject.object_id == DataObject.id)
    waiting: list[DataObject] = []
    for obj in session.scalars(stmt.where(JobObject.job_id == job_id).order_by(DataObject.name)):
        if obj.state in (ObjectState.FAILED, ObjectState.REMOVED):
            return None, f"{obj.kind} {obj.name!r} is {obj.state}" + (f": {obj.reason}" if obj.reason else "")
        if obj.state == ObjectState.DOWNLOADING:
            waiting.append(obj)
        elif obj.job_id == job_id and disk_gb is not None and obj.size_bytes > disk_gb * GB:
            return None, (
                f"its input is {obj.size_bytes / GB:.1f} GB, more than the worker's disk_size of {disk_gb} "
                "GB it counts against: raise resources.disk_size"
            )
    if not waiting:
        return None, None
    named = ", ".join(f"{o.kind} {o.name!r}" for o in waiting)
    first = waiting[0]
    return f"{WAITING_FOR_DATA}: {named} still downloading (`provision {first.kind} show {first.name}`)", None


# ------------------------------------------------------------------------------- an inference job's input


def input_bytes(session: Session, job_id: str) -> int:
    """The size of a job's own inference input (0: none, or not downloaded yet)."""
    return int(session.scalar(select(DataObject.size_bytes).where(DataObject.job_id == job_id)) or 0)


def input_for(
    session: Session,
    principal: Principal,
    project_id: str,
    job_id: str,
    job_name: str,
    uri: str,
    *,
    key: str | None,
    endpoint_url: str | None,
) -> DataObject:
    """An inference job's one-time input (data.input.uri): a dataset of its own, read like any remote
    source, mounted at /opt/ml/input once ready, and removed when the job ends (purge_inputs)."""
    source = parse_source(uri)
    _credentials(session, project_id, source, key)  # a key named but missing is refused now
    project = session.get(Project, project_id)
    assert project is not None
    name = f"{job_name}-input-{job_id.removeprefix('job_')[:8]}"
    obj = _new(session, principal, project, ObjectKind.DATASET, name, uri, endpoint_url=endpoint_url, key=key)
    obj.job_id = job_id
    wake_after_commit(session, Wake.OBJECTS)
    return obj


def purge_inputs(session: Session) -> int:
    """Remove the inputs of jobs that ended; how many."""
    from provisioner.domain.states import JOB_DONE

    stmt = (
        select(DataObject)
        .join(Job, Job.id == DataObject.job_id)
        .where(_live(), Job.state.in_([s.value for s in JOB_DONE]))
    )
    done = 0
    for obj in session.scalars(stmt):
        digest = obj.digest
        transition(session, obj, ObjectState.REMOVED, actor="rigbase:objects", reason="its job ended")
        _forget_bytes(session, obj.project_id, digest)
        done += 1
    return done
