"""/v1/datasets, /v1/models, /v1/checkpoints: a project's persistent data (services/objects/data_objects.py);
/v1/objects/{id}/…: an upload's chunks and manifest; and the node routes a minion fetches an object by.

The three kinds share one set of routes, built per kind, so they cannot drift apart."""

from __future__ import annotations

from datetime import datetime
from enum import Enum
from typing import Annotated

from fastapi import APIRouter, Body, Path, Query, Request, Response
from fastapi.responses import RedirectResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from contracts.data_objects import (
    CHUNK_BYTES,
    CHUNK_ROUTE,
    MANIFEST_ROUTE,
    NAME_MAX,
    OUTPUT_ROUTE,
    ChunkList,
    Manifest,
    MissingChunks,
    ObjectKind,
)
from contracts.errors import InvalidInput
from contracts.jobs import WORKER_NUMBERS
from provisioner.api.deps import Db, NodeCredential, Principal
from provisioner.api.errors import NODE_ERRORS, documented
from provisioner.api.schemas import Page
from provisioner.services.jobs import job_outputs
from provisioner.services.objects import data_objects as service
from provisioner.services.objects import outputs
from provisioner.store.data_models import DataObject, JobOutput

# every route names a project, an object or a job that may not be there, and refuses what its rules forbid
router = APIRouter(tags=["data"], responses=documented(403, 404, 409))
node_router = APIRouter(tags=["minion"])

PLURAL = {ObjectKind.DATASET: "datasets", ObjectKind.MODEL: "models", ObjectKind.CHECKPOINT: "checkpoints"}
_SHA = Annotated[str, Path(pattern=r"^[0-9a-f]{64}$")]


class ObjectIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=NAME_MAX)
    source: str = Field(
        max_length=4096, description="s3://, gs://, https://, http://, git+https://, or upload:PATH"
    )
    project: str | None = Field(None, description="the project (name, OWNER/NAME or id); else the default")
    endpoint_url: str | None = Field(None, max_length=2048, description="an S3-compatible store's endpoint")
    key: str | None = Field(None, max_length=63, description="the project key that reads the source")
    public: bool = Field(False, description="readable by every account (root admins only)")


class ObjectOut(BaseModel):
    id: str
    kind: str
    name: str
    project: str
    source: str
    endpoint_url: str | None
    key: str | None
    public: bool
    job_id: str | None = Field(None, description="an inference job's one-time input: removed when it ends")
    state: str
    reason: str | None
    digest: str | None
    size_bytes: int
    file_count: int
    created_by: str
    created_at: datetime
    ready_at: datetime | None

    @classmethod
    def of(cls, row: DataObject, project: str) -> ObjectOut:
        return cls(
            id=row.id,
            kind=row.kind,
            name=row.name,
            project=project,
            source=row.source,
            endpoint_url=row.endpoint_url,
            key=row.key_name,
            public=row.public,
            job_id=row.job_id,
            state=row.state,
            reason=row.reason,
            digest=row.digest,
            size_bytes=row.size_bytes,
            file_count=row.file_count,
            created_by=row.created_by,
            created_at=row.created_at,
            ready_at=row.ready_at,
        )


def _out(session: Db, row: DataObject) -> ObjectOut:
    return ObjectOut.of(row, service.project_name(session, row))


def _routes(kind: ObjectKind) -> None:
    base = f"/v1/{PLURAL[kind]}"

    def create(body: ObjectIn, session: Db, principal: Principal) -> ObjectOut:
        row = service.create(
            session,
            principal,
            kind,
            body.name,
            body.source,
            project=body.project,
            endpoint_url=body.endpoint_url,
            key=body.key,
            public=body.public,
        )
        return _out(session, row)

    def list_(session: Db, principal: Principal, project: str | None = None) -> Page[ObjectOut]:
        return Page(
            items=[_out(session, r) for r in service.list_objects(session, principal, kind, project=project)]
        )

    def show(ref: str, session: Db, principal: Principal, project: str | None = None) -> ObjectOut:
        return _out(session, service.get(session, principal, kind, ref, project=project))

    def files(ref: str, session: Db, principal: Principal, project: str | None = None) -> Manifest:
        return service.manifest_of(session, service.get(session, principal, kind, ref, project=project))

    def remove(ref: str, session: Db, principal: Principal, project: str | None = None) -> ObjectOut:
        return _out(session, service.remove(session, principal, kind, ref, project=project))

    tag: list[str | Enum] = [PLURAL[kind]]
    router.add_api_route(
        base,
        create,
        methods=["POST"],
        status_code=201,
        tags=tag,
        name=f"create_{kind}",
        summary=f"Create a {kind} from its source",
    )
    router.add_api_route(base, list_, methods=["GET"], tags=tag, name=f"list_{kind}s")
    router.add_api_route(f"{base}/{{ref}}", show, methods=["GET"], tags=tag, name=f"show_{kind}")
    router.add_api_route(
        f"{base}/{{ref}}/manifest",
        files,
        methods=["GET"],
        tags=tag,
        name=f"{kind}_manifest",
        summary=f"Every file of a ready {kind}",
    )
    router.add_api_route(f"{base}/{{ref}}", remove, methods=["DELETE"], tags=tag, name=f"remove_{kind}")


for _kind in ObjectKind:
    _routes(_kind)


@router.post("/v1/objects/{object_id}/missing", tags=["data"])
def missing(object_id: str, body: ChunkList, session: Db, principal: Principal) -> MissingChunks:
    """Which chunks an upload still has to send (an interrupted upload resumes from here)."""
    return MissingChunks(missing=service.missing_chunks(session, principal, object_id, body.chunks))


_OCTETS = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
_BINARY = {"requestBody": {"content": _OCTETS}}  # a chunk's raw bytes (FastAPI reads no model for them)


async def _body(request: Request) -> bytes:
    data = bytearray()
    async for piece in request.stream():
        data += piece
        if len(data) > CHUNK_BYTES:
            raise InvalidInput(f"a chunk is at most {CHUNK_BYTES} bytes", code="invalid_chunk")
    return bytes(data)


@router.put(
    "/v1/objects/{object_id}/chunks/{sha256}",
    status_code=204,
    tags=["data"],
    openapi_extra=_BINARY,
)
async def put_chunk(
    object_id: str, sha256: _SHA, request: Request, session: Db, principal: Principal
) -> Response:
    """One chunk (at most 8 MiB), checked against its SHA-256."""
    data = await _body(request)
    await run_in_threadpool(service.put_chunk, session, principal, object_id, sha256, data)
    return Response(status_code=204)


@router.post("/v1/objects/{object_id}/manifest", tags=["data"])
def finish(
    object_id: str, session: Db, principal: Principal, manifest: Annotated[Manifest, Body()]
) -> ObjectOut:
    """The upload's manifest: the object is ready once every chunk it names is held."""
    return _out(session, service.finish_upload(session, principal, object_id, manifest))


@node_router.get(MANIFEST_ROUTE, responses={**NODE_ERRORS, **documented(404)})
def node_manifest(node_id: str, object_id: str, session: Db, credential: NodeCredential) -> Response:
    """The manifest of an object a worker on this node mounts, in its canonical bytes (the node checks
    them against the digest of its assignment)."""
    obj = service.for_node(session, node_id, credential, object_id)
    return Response(service.manifest_of(session, obj).canonical(), media_type="application/json")


@node_router.get(CHUNK_ROUTE, responses={**NODE_ERRORS, **documented(404)})
def node_chunk(
    node_id: str,
    object_id: str,
    chunk: _SHA,
    session: Db,
    credential: NodeCredential,
    direct: Annotated[
        bool, Query(description="false: the bytes through the control plane, never a pre-signed URL")
    ] = True,
) -> Response:
    """One chunk of that object: its bytes, or a 307 to a pre-signed URL of the bucket store that holds
    it (the node checks the bytes against the chunk's SHA-256 either way)."""
    obj = service.for_node(session, node_id, credential, object_id)
    answer = service.chunk_for_node(session, obj, chunk, direct=direct)
    if isinstance(answer, str):
        return RedirectResponse(answer, status_code=307)
    return Response(answer, media_type="application/octet-stream")


# ------------------------------------------------------------------------------- a worker's output

_WORKER = Annotated[int, Path(ge=0, lt=WORKER_NUMBERS)]


@node_router.post(OUTPUT_ROUTE + "/missing", responses={**NODE_ERRORS, **documented(404, 409)})
def output_missing(
    node_id: str, job_id: str, worker: _WORKER, body: ChunkList, session: Db, credential: NodeCredential
) -> MissingChunks:
    """Which chunks of a worker's /opt/ml/output its node still has to send."""
    return MissingChunks(missing=outputs.missing(session, node_id, credential, job_id, worker, body.chunks))


@node_router.put(
    OUTPUT_ROUTE + "/chunks/{sha256}",
    status_code=204,
    responses={**NODE_ERRORS, **documented(404)},
    openapi_extra=_BINARY,
)
async def output_chunk(
    node_id: str,
    job_id: str,
    worker: _WORKER,
    sha256: _SHA,
    request: Request,
    session: Db,
    credential: NodeCredential,
) -> Response:
    """One chunk of that output (at most 8 MiB), checked against its SHA-256."""
    data = await _body(request)
    await run_in_threadpool(outputs.put_chunk, session, node_id, credential, job_id, worker, sha256, data)
    return Response(status_code=204)


class OutputOut(BaseModel):
    job_id: str
    worker: int
    state: str = Field(description="kept, pending (to deliver), delivered or failed")
    destination: str | None = Field(description="where the spec's data.output sends it; none: kept only")
    reason: str | None
    digest: str
    size_bytes: int
    file_count: int
    attempts: int
    created_at: datetime
    delivered_at: datetime | None

    @classmethod
    def of(cls, row: JobOutput) -> OutputOut:
        return cls.model_validate(row, from_attributes=True)


@node_router.post(OUTPUT_ROUTE + "/manifest", responses={**NODE_ERRORS, **documented(404, 409)})
def output_manifest(
    node_id: str,
    job_id: str,
    worker: _WORKER,
    session: Db,
    credential: NodeCredential,
    manifest: Annotated[Manifest, Body()],
) -> OutputOut:
    """The output's manifest, once every chunk is sent: it is kept, and delivered where the spec says."""
    return OutputOut.of(outputs.finish(session, node_id, credential, job_id, worker, manifest))


@router.get("/v1/jobs/{ref}/outputs", tags=["jobs"])
def job_outputs_list(ref: str, session: Db, principal: Principal) -> Page[OutputOut]:
    """What each worker left in /opt/ml/output, and where it went."""
    return Page(items=[OutputOut.of(r) for r in job_outputs.list_outputs(session, principal, ref)])


@router.get("/v1/jobs/{ref}/outputs/{worker}/manifest", tags=["jobs"])
def job_output_manifest(ref: str, worker: _WORKER, session: Db, principal: Principal) -> Manifest:
    return outputs.manifest_of(session, job_outputs.output(session, principal, ref, worker))


@router.get("/v1/jobs/{ref}/outputs/{worker}/chunks/{sha256}", tags=["jobs"])
def job_output_chunk(ref: str, worker: _WORKER, sha256: _SHA, session: Db, principal: Principal) -> Response:
    out = job_outputs.output(session, principal, ref, worker)
    return Response(outputs.chunk_of(session, out, sha256), media_type="application/octet-stream")
