"""What each worker left in /opt/ml/output (docs/data.md, "Outputs").

When a worker with its own output directory ends, its node uploads the directory the way the CLI uploads
a dataset: the chunks it lacks, then the manifest (contracts/object_tree.py's one chunking rule), over the
node credential, before it closes the worker's log. The control plane keeps it under the job's project and
delivers it where the spec's `data.output` says:

- `uri: s3://…` or `gs://…`: one zip, `JOB.zip`, or `JOB_WORKER.zip` for a job of several workers (trainML's
  names), written with the project's aws or gcp key;
- `kind` and `name`: a new ready dataset, model or checkpoint of the project (`NAME_WORKER` for several
  workers), made from the same chunks, so nothing is copied.

A delivery that fails is retried on the next passes and, after FAILED_AFTER tries, marked failed with the
reason, which `provision job output` shows; the output stays downloadable. A datastore output (`data.output:
{datastore, path}`) is written in place by the job and is not uploaded."""

from __future__ import annotations

import hashlib
import tempfile
import zipfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from contracts.data_objects import CHUNK_BYTES, KEY_KIND_OF, SHA256_HEX, Manifest, ObjectKind, parse_source
from contracts.errors import InvalidInput, NotFound, RuleViolation
from contracts.jobspec import JobSpec
from provisioner.adapters.object_store import ObjectStore, check_held, chunk_key, manifest_key
from provisioner.adapters.sources import Credentials, SourceError, networks_of, upload_file
from provisioner.domain.key_kinds import DEFAULT_NAME, KeyKind
from provisioner.domain.states import OUTPUT_TRANSITIONS, ObjectState, OutputState
from provisioner.services.accounts import project_keys
from provisioner.services.common import lifecycle
from provisioner.services.common.runtime import runtime_of
from provisioner.services.common.wakeups import Wake, wake_after_commit
from provisioner.services.fleet import node_credentials
from provisioner.services.objects import data_objects
from provisioner.store.data_models import DataObject, JobOutput
from provisioner.store.engine import session_scope
from provisioner.store.job_models import Job, JobWorker
from provisioner.store.models import new_id

KIND = "job output"
FAILED_AFTER: Final = 3
ACTOR = "rigbase:outputs"


def _transition(session: Session, row: JobOutput, to: OutputState, reason: str | None = None) -> None:
    name = f"{row.job_id}/{row.worker}"
    lifecycle.apply(
        session,
        row,
        to,
        kind=KIND,
        name=name,
        table=OUTPUT_TRANSITIONS,
        actor=ACTOR,
        reason=reason,
        resource_id=name,
    )


def _worker(session: Session, node_id: str, credential: str | None, job_id: str, worker: int) -> JobWorker:
    node, _ = node_credentials.node_for_credential(session, node_id, credential)
    row = session.scalar(select(JobWorker).where(JobWorker.job_id == job_id, JobWorker.index == worker))
    if row is None or row.node_id != node.id:
        raise NotFound(f"worker {worker} of job '{job_id}' did not run on this node", code="worker_not_here")
    return row


def _project_of(row: JobWorker) -> str:
    return row.job.project_id


def missing(
    session: Session, node_id: str, credential: str | None, job_id: str, worker: int, chunks: list[str]
) -> list[str]:
    row = _worker(session, node_id, credential, job_id, worker)
    store = runtime_of(session).objects()
    if any(not SHA256_HEX.fullmatch(c) for c in chunks):
        raise InvalidInput("a chunk is named by its SHA-256 in lowercase hex", code="invalid_chunk")
    return [c for c in dict.fromkeys(chunks) if not store.has(chunk_key(_project_of(row), c))]


def put_chunk(
    session: Session, node_id: str, credential: str | None, job_id: str, worker: int, sha256: str, data: bytes
) -> None:
    row = _worker(session, node_id, credential, job_id, worker)
    if len(data) > CHUNK_BYTES or hashlib.sha256(data).hexdigest() != sha256:
        raise InvalidInput(
            "the chunk's bytes do not match its SHA-256: send it again", code="digest_mismatch"
        )
    runtime_of(session).objects().put(chunk_key(_project_of(row), sha256), data)


def _destination(spec: JobSpec, job_name: str, worker: int, workers: int) -> str | None:
    out = spec.data.output
    if out is None or out.datastore is not None:
        return None
    suffix = f"_{worker}" if workers > 1 else ""
    if out.uri is not None:
        return f"{out.uri.rstrip('/')}/{job_name}{suffix}.zip"
    return f"{out.kind} {out.name}{suffix}"


def finish(
    session: Session, node_id: str, credential: str | None, job_id: str, worker: int, manifest: Manifest
) -> JobOutput:
    """Keep the worker's output once every chunk is held; idempotent for the same manifest (a node that
    restarted mid-way sends it again)."""
    row = _worker(session, node_id, credential, job_id, worker)
    project = _project_of(row)
    store = runtime_of(session).objects()
    why = check_held(store, project, manifest)
    if why is not None:
        raise RuleViolation(why, code="chunks_missing")
    digest = manifest.digest()
    held = session.get(JobOutput, (job_id, worker))
    if held is not None:
        return held
    store.put(manifest_key(project, digest), manifest.canonical())
    job = row.job
    spec = JobSpec.model_validate(job.spec)
    where = _destination(spec, job.name, worker, len(job.workers))
    out = JobOutput(
        job_id=job_id,
        worker=worker,
        project_id=project,
        digest=digest,
        size_bytes=manifest.size,
        file_count=len(manifest.files),
        destination=where,
        attempts=0,
    )
    session.add(out)
    _transition(
        session, out, OutputState.PENDING if where else OutputState.KEPT, reason="uploaded by its node"
    )
    if where:
        wake_after_commit(session, Wake.OBJECTS)
    return out


# ------------------------------------------------------------------------------- delivery


def pending(session: Session, limit: int = 16) -> list[tuple[str, int]]:
    stmt = select(JobOutput.job_id, JobOutput.worker).where(JobOutput.state == OutputState.PENDING.value)
    return [(j, w) for j, w in session.execute(stmt.order_by(JobOutput.created_at).limit(limit))]


def _zip(store: ObjectStore, project: str, manifest: Manifest, path: Path) -> None:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, allowZip64=True) as zf:
        for entry in manifest.files:
            with zf.open(entry.path, "w", force_zip64=entry.size > 2**31) as member:
                for sha in entry.chunks:
                    member.write(store.get(chunk_key(project, sha)))


def _as_object(session: Session, out: JobOutput, spec: JobSpec, manifest: Manifest) -> str | None:
    """A new ready object from the output's chunks; the reason when it cannot be made."""
    target = spec.data.output
    assert target is not None and target.kind is not None and out.destination is not None
    name = out.destination.split(" ", 1)[1]
    job = session.get(Job, out.job_id)
    assert job is not None
    taken = session.scalar(
        select(func.count()).where(
            DataObject.project_id == out.project_id,
            DataObject.kind == target.kind.value,
            DataObject.name == name,
            DataObject.state != ObjectState.REMOVED.value,
        )
    )
    if taken:
        return (
            f"{target.kind} {name!r} already exists in the project: remove it, or name another in data.output"
        )
    obj = DataObject(
        id=new_id("obj"),
        project_id=out.project_id,
        account_id=job.account_id,
        kind=ObjectKind(target.kind).value,
        name=name,
        source=f"job:{job.name}/{out.worker}",
        size_bytes=0,
        file_count=0,
        created_by=ACTOR,
    )
    session.add(obj)
    data_objects.transition(
        session, obj, ObjectState.DOWNLOADING, actor=ACTOR, reason=f"output of {job.name}"
    )
    data_objects.mark_ready(session, obj, manifest, actor=ACTOR)
    return None


def deliver(sessions: sessionmaker[Session], job_id: str, worker: int, work_dir: Path) -> None:
    """One delivery attempt; the output is delivered, or its reason says why not (failed after the last)."""
    with session_scope(sessions) as session:
        out = session.get(JobOutput, (job_id, worker))
        job = session.get(Job, job_id)
        if out is None or job is None or out.state != OutputState.PENDING:
            return
        spec = JobSpec.model_validate(job.spec)
        store = runtime_of(session).objects()
        manifest = Manifest.model_validate_json(store.get(manifest_key(out.project_id, out.digest)))
        target = spec.data.output
        assert target is not None
        creds: Credentials | None = None
        if target.uri is not None:
            kind = KeyKind(KEY_KIND_OF[parse_source(target.uri).scheme])
            label = target.key or DEFAULT_NAME
            found = project_keys.secret_of(session, job.project_id, kind, label)
            creds = Credentials(f"{kind}/{label}", *found) if found else None
        if target.kind is not None:
            why = _as_object(session, out, spec, manifest)
            _done(session, out, why)
            return
        destination, project, endpoint = out.destination, out.project_id, target.endpoint_url
        allowed = networks_of(runtime_of(session).settings.source_networks)
    assert destination is not None
    why = None
    with tempfile.TemporaryDirectory(dir=work_dir) as scratch:
        archive = Path(scratch) / "output.zip"
        try:
            _zip(store, project, manifest, archive)
            upload_file(archive, destination, credentials=creds, endpoint_url=endpoint, allowed=allowed)
        except SourceError as exc:
            why = str(exc)
    with session_scope(sessions) as session:
        out = session.get(JobOutput, (job_id, worker))
        if out is not None and out.state == OutputState.PENDING:
            _done(session, out, why)


def _done(session: Session, out: JobOutput, why: str | None) -> None:
    out.attempts += 1
    if why is None:
        out.delivered_at = datetime.now(UTC)
        _transition(session, out, OutputState.DELIVERED, reason=f"to {out.destination}")
    elif out.attempts >= FAILED_AFTER:
        _transition(session, out, OutputState.FAILED, reason=f"{out.destination}: {why}"[:1000])
    else:
        out.reason = f"try {out.attempts} of {FAILED_AFTER} failed: {why}"[:1000]


# ------------------------------------------------------------------------------- reading it back


def of_job(session: Session, job_id: str) -> list[JobOutput]:
    return list(
        session.scalars(select(JobOutput).where(JobOutput.job_id == job_id).order_by(JobOutput.worker))
    )


def manifest_of(session: Session, out: JobOutput) -> Manifest:
    return Manifest.model_validate_json(
        runtime_of(session).objects().get(manifest_key(out.project_id, out.digest))
    )


def chunk_of(session: Session, out: JobOutput, sha256: str) -> bytes:
    if sha256 not in manifest_of(session, out).chunk_set():
        raise NotFound(f"the output has no chunk {sha256[:16]}…", code="chunk_not_found")
    return runtime_of(session).objects().get(chunk_key(out.project_id, sha256))
