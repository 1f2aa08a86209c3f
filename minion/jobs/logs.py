"""A worker's combined stdout/stderr, shipped in order to the control plane, resumable on both sides.

podman writes each container's output to a k8s-file log we place in the worker's directory (it survives
`podman rm` and a minion restart): one line per piece of output, `TIME STREAM F|P CONTENT`, F for a piece
that ended a line, P for a partial one, stdout and stderr interleaved in the order conmon read them.
The worker's output is those CONTENTs in file order (utf-8; invalid bytes become U+FFFD, per entry, so the
text is the same on every read), a newline after each F.

The shipper posts it as LogChunks (contracts/jobs.py) whose `offset` is a byte offset into that output,
and keeps a checkpoint — the acked offset and the log-file position it corresponds to — in the worker's
directory, written after every ack. After a restart of the minion it continues from the checkpoint; when
the control plane answers with another acked offset (it restarted and lost nothing, or lost the tail) it
repositions there by re-reading the file. An empty chunk with `eof` closes the output once the container
ended and everything was acked."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

from pydantic import ValidationError

from contracts.jobs import LOG_CHUNK_MAX, LOG_ROUTE, LogAck, LogChunk
from minion.join.client import ConnectionProblem, ControlPlane

log = logging.getLogger(__name__)

CHUNK_TARGET: Final = 64 * 1024  # bytes per chunk while following; at most LOG_CHUNK_MAX


class LogUnavailable(Exception):
    """The receiver cannot be reached now; try again later from the same offset."""


class LogTransport(Protocol):
    def send(self, job_id: str, worker: int, chunk: LogChunk) -> LogAck | None:
        """Post one chunk; its ack, None when the receiver does not know this worker (stop shipping), or
        LogUnavailable to retry later."""
        ...


@dataclass
class ControlPlaneLogs:
    """LogTransport over the minion's own outbound connection, with the node credential."""

    cp: ControlPlane
    node: Callable[[], dict[str, Any]]  # node.json as the run loop keeps it (a rejoin renews the credential)

    def send(self, job_id: str, worker: int, chunk: LogChunk) -> LogAck | None:
        node = self.node()
        path = LOG_ROUTE.format(node_id=node["node_id"], job_id=job_id, worker=worker)
        return post_chunk(self.cp, path, node["node_credential"], chunk)


def post_chunk(cp: ControlPlane, path: str, token: str, chunk: LogChunk) -> LogAck | None:
    """POST one chunk to a log route (a job worker's, a device's) and read the answer as LogTransport.send
    promises: its ack, None when the receiver does not know the sender, LogUnavailable to retry later."""
    try:
        response = cp.post(path, chunk.model_dump(mode="json"), token=token)
    except ConnectionProblem as exc:
        raise LogUnavailable(str(exc)) from None
    if response.status_code in (404, 409, 410):
        return None
    if response.status_code >= 400:
        raise LogUnavailable(f"log chunk refused: HTTP {response.status_code} {response.text[:200]}")
    try:
        return LogAck.model_validate_json(response.content)
    except ValidationError:
        raise LogUnavailable("unreadable log acknowledgement") from None


def entry_bytes(line: bytes) -> bytes:
    """The output bytes of one k8s-file line (with its trailing newline)."""
    parts = line.rstrip(b"\n").split(b" ", 3)
    if len(parts) < 3:
        return b""
    content = parts[3] if len(parts) == 4 else b""
    text = content.decode("utf-8", "replace").encode()
    return text + b"\n" if parts[2].split(b":")[0] == b"F" else text


def last_lines(path: Path, count: int, window: int = 16 * 1024) -> list[str]:
    """The last `count` output lines of a k8s-file log (read from its last `window` bytes)."""
    try:
        with path.open("rb") as handle:
            start = max(0, path.stat().st_size - window)
            handle.seek(start)
            lines = handle.read().splitlines(keepends=True)
    except OSError:
        return []
    text = b"".join(entry_bytes(line) for line in (lines[1:] if start else lines))  # not a cut first line
    return [line for line in text.decode("utf-8", "replace").splitlines() if line.strip()][-count:]


def entries(path: Path, position: int) -> Iterator[tuple[int, bytes]]:
    """(position after the line, its output) for each complete line from `position`."""
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return
    with handle:
        handle.seek(position)
        for line in handle:
            if not line.endswith(b"\n"):  # conmon is still writing it
                return
            position += len(line)
            yield position, entry_bytes(line)


def char_boundary(data: bytes, limit: int) -> int:
    """The largest cut <= limit that does not split a utf-8 character."""
    cut = min(limit, len(data))
    while 0 < cut < len(data) and (data[cut] & 0xC0) == 0x80:
        cut -= 1
    return cut


@dataclass
class Checkpoint:
    acked: int = 0  # bytes of output the receiver holds
    position: int = 0  # log-file offset of the first line not wholly acked
    skip: int = 0  # bytes of that line's output already acked (a line longer than a chunk)
    eof: bool = False  # the receiver holds the whole output
    gone: bool = False  # the receiver does not know this worker; nothing more is sent

    @classmethod
    def load(cls, path: Path) -> Checkpoint:
        try:
            data = json.loads(path.read_text())
            return cls(**{k: data[k] for k in ("acked", "position", "skip", "eof", "gone") if k in data})
        except (OSError, ValueError, TypeError):
            return cls()

    def save(self, path: Path) -> None:
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(self.__dict__))
        os.replace(temporary, path)  # atomic: a crash leaves the old checkpoint or the new one


@dataclass
class LogShipper:
    job_id: str
    worker: int
    generation: str
    log_path: Path
    checkpoint_path: Path
    transport: LogTransport
    chunk_target: int = CHUNK_TARGET
    max_chunks: int = 16  # per pump while the container runs, so the worker gets back to its stop checks

    def __post_init__(self) -> None:
        self.state = Checkpoint.load(self.checkpoint_path)

    def _seek(self, offset: int) -> Checkpoint:
        """The checkpoint for output offset `offset`, found by re-reading the file from its start."""
        at = Checkpoint()
        for position, data in entries(self.log_path, 0):
            if at.acked + len(data) > offset:
                return Checkpoint(acked=offset, position=at.position, skip=offset - at.acked)
            at = Checkpoint(acked=at.acked + len(data), position=position)
        # the file ends before `offset` (the receiver holds more than this file has): go on from its offset
        return Checkpoint(acked=offset, position=at.position)

    def _next_chunk(self) -> tuple[bytes, int, int]:
        """(data, position, skip) of the next chunk after the checkpoint; data may be empty."""
        state = self.state
        out = bytearray()
        position, skip = state.position, state.skip
        for after, data in entries(self.log_path, state.position):
            data = data[skip:]
            room = self.chunk_target - len(out)
            if len(data) > room:
                if out:  # a whole line goes in the next chunk
                    break
                cut = char_boundary(data, room)
                return bytes(data[:cut]), position, skip + cut
            out += data
            position, skip = after, 0
            if len(out) >= self.chunk_target:
                break
        return bytes(out), position, skip

    def pump(self, ended: bool) -> bool:
        """Send what the log holds now (and eof when `ended` and all was acked); True when done (eof acked
        or the receiver does not know the worker). LogUnavailable leaves the checkpoint where it was."""
        for _ in range(self.max_chunks if not ended else 2**31):  # a chatty container still yields
            if self.state.eof or self.state.gone:
                return True
            data, position, skip = self._next_chunk()
            if not data and not ended:
                return False
            chunk = LogChunk(
                offset=self.state.acked, data=data.decode(), eof=not data, generation=self.generation
            )
            ack = self.transport.send(self.job_id, self.worker, chunk)
            if ack is None:
                self.state.gone = True
            elif chunk.eof and ack.acked == chunk.offset:
                self.state.eof = True
            elif ack.acked == chunk.offset + len(data):
                self.state = Checkpoint(acked=ack.acked, position=position, skip=skip)
            elif ack.acked != chunk.offset:  # the receiver holds another prefix: continue from its offset
                log.info("log of %s/%s: receiver holds %d bytes, not %d", *self.key, ack.acked, chunk.offset)
                self.state = self._seek(ack.acked)
            else:
                raise LogUnavailable(f"the receiver did not take the chunk at {chunk.offset}")
            self.state.save(self.checkpoint_path)
        return self.state.eof or self.state.gone

    @property
    def key(self) -> tuple[str, int]:
        return (self.job_id, self.worker)


assert CHUNK_TARGET <= LOG_CHUNK_MAX
