"""Inference container logs: the device's minion posts its container's output as LogChunks (contracts.jobs,
the job logs' contract) over its outbound connection, per container generation (the deploy, plus the boot
it started in); `provision device logs DEVICE [--follow]` reads the newest generation back.

Stored idempotently by byte offset as job logs are (services/jobs/job_logs.py): a chunk past what is held is
not
stored and the answer's `acked` says where to resend from; an overlapping chunk adds only its new tail."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from contracts.errors import InvalidInput, NotFound
from contracts.jobs import LogAck, LogChunk
from provisioner.domain.states import INFERENCE_ENDED, InferenceState, Service
from provisioner.services.common.errors import flush
from provisioner.services.devices import device_deployments
from provisioner.services.fleet import node_credentials
from provisioner.services.jobs import job_logs
from provisioner.store.device_models import DeviceLogChunk


def _held(session: Session, node_id: str, generation: str) -> tuple[int, bool]:
    """Bytes held without a gap from 0 (chunks are only ever stored from there), and whether the end came."""
    mine = (DeviceLogChunk.node_id == node_id, DeviceLogChunk.generation == generation)
    size = session.scalar(select(func.coalesce(func.sum(DeviceLogChunk.size), 0)).where(*mine))
    ended = session.scalar(select(func.count()).where(*mine, DeviceLogChunk.eof.is_(True)))
    return int(size or 0), bool(ended)


def append(session: Session, node_id: str, credential: str | None, chunk: LogChunk) -> LogAck:
    """Store one chunk from the device itself (module docstring)."""
    node, _ = node_credentials.node_for_credential(session, node_id, credential)
    if Service(node.service) is not Service.DEVICE or not chunk.generation:
        raise NotFound("this node runs no device configuration: drop the log", code="not_a_device")
    held, eof = _held(session, node.id, chunk.generation)
    data = chunk.data.encode()
    end = chunk.offset + len(data)
    ends_here = chunk.eof and chunk.offset <= held <= end
    if chunk.offset <= held < end:
        tail = data[held - chunk.offset :]
        session.add(
            DeviceLogChunk(
                node_id=node.id,
                generation=chunk.generation,
                offset=held,
                size=len(tail),
                data=tail.decode(errors="replace"),
                eof=ends_here,
            )
        )
        held, eof = end, eof or ends_here
    elif ends_here and end == held and not eof:  # the empty closing chunk
        session.add(
            DeviceLogChunk(
                node_id=node.id, generation=chunk.generation, offset=held, size=0, data="", eof=True
            )
        )
        eof = True
    flush(session, f"the log of device '{node.name}'")
    return LogAck(acked=held, eof=eof)


@dataclass(frozen=True)
class DeviceLogPage:
    """Bytes [offset, next_offset) of the newest container's output; `complete`: nothing more will come."""

    device: str
    generation: str | None
    inference_status: str | None
    offset: int
    next_offset: int
    data: str
    complete: bool


def read(
    session: Session, ref: str, region: str | None = None, offset: int = 0, generation: str | None = None
) -> DeviceLogPage:
    node = device_deployments.device(session, ref, region)
    if offset < 0:
        raise InvalidInput("offset must be 0 or more", code="invalid_offset")
    dep = device_deployments.deployment_of(session, node)
    if generation is None:
        generation = dep.reported_generation if dep is not None else None
    if generation is None and dep is not None and dep.generation is not None:
        # not reported yet: the newest output of this deploy's containers (one per boot), if any arrived
        generation = session.scalar(
            select(DeviceLogChunk.generation)
            .where(
                DeviceLogChunk.node_id == node.id,
                DeviceLogChunk.generation.startswith(dep.generation + ".", autoescape=True),
            )
            .order_by(DeviceLogChunk.id.desc())
            .limit(1)
        )
    data, position = "", offset
    if generation is not None:
        chunks = session.scalars(
            select(DeviceLogChunk)
            .where(
                DeviceLogChunk.node_id == node.id,
                DeviceLogChunk.generation == generation,
                DeviceLogChunk.offset + DeviceLogChunk.size > offset,
            )
            .order_by(DeviceLogChunk.offset)
        )
        data, position = job_logs.joined(chunks, offset)
    held, eof = _held(session, node.id, generation) if generation else (0, False)
    state = dep.inference_state if dep is not None else None
    if generation is None:  # nothing shipped yet: more comes only if something was deployed
        ended = dep is None or dep.generation is None
    else:
        ended = state is not None and _ended(state) and eof
    return DeviceLogPage(
        device=node.name,
        generation=generation,
        inference_status=state,
        offset=offset,
        next_offset=position,
        data=data,
        complete=ended and position >= held,
    )


def _ended(value: str) -> bool:
    return InferenceState(value) in INFERENCE_ENDED
