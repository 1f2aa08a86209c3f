"""The control plane's end of the nodes' tunnels (contracts/tunnel.py, docs/job-urls.md).

Each node's minion holds one WebSocket to TUNNEL_ROUTE; the hub keeps it by node id. `open` asks that
node for a TCP stream to a worker's port (a StreamOpen on its tunnel) and waits for the node to open the
stream's own WebSocket, which `arrived` hands over. A TunnelStream is then read and written like a socket,
its bytes the binary messages of that WebSocket.

The hub lives in the process the node's tunnel reached: with `provision serve --workers N` a URL is served
only by the process that holds its node's tunnel (docs/job-urls.md says what that means).

Streams are counted per job and per source address, so one client opening thousands of connections is
refused (429) before it takes a node's tunnel or another job's share."""

from __future__ import annotations

import asyncio
import secrets
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Final

from starlette.websockets import WebSocket, WebSocketState

from contracts.errors import RigbaseError, Unavailable
from contracts.tunnel import StreamOpen

OPEN_TIMEOUT_S: Final = 10.0


class TooManyStreams(RigbaseError):
    default_code = "too_many_connections"


class StreamRefused(Unavailable):
    """The node could not reach the worker's port: its reason, in one line."""


@dataclass
class TunnelStream:
    """One TCP connection to a worker's port, over the stream's WebSocket."""

    ws: WebSocket
    done: asyncio.Event = field(default_factory=asyncio.Event)
    close_code: int | None = None
    close_reason: str = ""
    _eof: bool = False

    async def read(self) -> bytes:
        """The next bytes; b"" once the node closed the stream."""
        if self._eof:
            return b""
        message = await self.ws.receive()
        if message["type"] == "websocket.disconnect":
            self._eof = True
            self.close_code = message.get("code")
            self.close_reason = message.get("reason") or ""
            return b""
        data = message.get("bytes")
        return data if data is not None else (message.get("text") or "").encode()

    async def write(self, data: bytes) -> None:
        if self._eof or self.ws.application_state is not WebSocketState.CONNECTED:
            raise ConnectionResetError("the node closed the stream")
        await self.ws.send_bytes(data)

    async def aclose(self) -> None:
        self.done.set()


@dataclass
class _Link:
    ws: WebSocket
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass
class TunnelHub:
    streams_per_job: int = 512
    streams_per_source: int = 256
    links: dict[str, _Link] = field(default_factory=dict)
    pending: dict[str, tuple[str, asyncio.Future[TunnelStream]]] = field(default_factory=dict)
    per_job: Counter[str] = field(default_factory=Counter)
    per_source: Counter[str] = field(default_factory=Counter)

    # -- the node's side ---------------------------------------------------------------------------------
    def attach(self, node_id: str, ws: WebSocket) -> _Link:
        """The node's tunnel, replacing one it held before (a reconnect after a cut)."""
        link = self.links[node_id] = _Link(ws)
        return link

    def detach(self, node_id: str, link: _Link) -> None:
        if self.links.get(node_id) is link:
            del self.links[node_id]

    def connected(self, node_id: str) -> bool:
        return node_id in self.links

    def arrived(self, node_id: str, stream_id: str, ws: WebSocket) -> TunnelStream | None:
        """The stream a node opened for a StreamOpen of ours; None for one nobody waits for (late, or not
        asked of this node)."""
        waiting = self.pending.get(stream_id)
        if waiting is None or waiting[0] != node_id or waiting[1].done():
            return None
        stream = TunnelStream(ws)
        waiting[1].set_result(stream)
        return stream

    # -- the proxy's side --------------------------------------------------------------------------------
    @contextmanager
    def admit(self, job_id: str, source: str) -> Iterator[None]:
        """One connection of `source` to `job_id`'s worker, within both limits (TooManyStreams)."""
        release = self.take(job_id, source)
        try:
            yield
        finally:
            release()

    def take(self, job_id: str, source: str) -> Callable[[], None]:
        """As `admit`, for a connection that outlives its handler (a streamed response): the callable
        gives the place back, once however often it is called."""
        if self.per_job[job_id] >= self.streams_per_job:
            raise TooManyStreams(
                f"job {job_id} has {self.per_job[job_id]} connections open, its limit: close some and retry"
            )
        if self.per_source[source] >= self.streams_per_source:
            raise TooManyStreams(
                f"{source} has {self.per_source[source]} connections open through the control plane, its "
                "limit: close some and retry"
            )
        self.per_job[job_id] += 1
        self.per_source[source] += 1
        given_back = False

        def release() -> None:
            nonlocal given_back
            if given_back:
                return
            given_back = True
            for counter, key in ((self.per_job, job_id), (self.per_source, source)):
                counter[key] -= 1
                if counter[key] <= 0:
                    del counter[key]

        return release

    async def open(self, node_id: str, job_id: str, worker: int, port: int) -> TunnelStream:
        """A TCP stream to `port` of the worker's container; Unavailable when the node has no tunnel here
        or does not answer, StreamRefused when it cannot reach the port."""
        link = self.links.get(node_id)
        if link is None:
            raise Unavailable(
                f"the node running job {job_id} has no tunnel to this control plane process: its minion "
                "reconnects by itself within a minute; retry then",
                code="tunnel_down",
            )
        stream_id = secrets.token_urlsafe(24)
        future: asyncio.Future[TunnelStream] = asyncio.get_running_loop().create_future()
        self.pending[stream_id] = (node_id, future)
        try:
            opening = StreamOpen(stream_id=stream_id, job_id=job_id, worker=worker, port=port)
            async with link.lock:
                await link.ws.send_text(opening.model_dump_json())
            stream = await asyncio.wait_for(future, OPEN_TIMEOUT_S)
        except (TimeoutError, RuntimeError, OSError) as exc:
            raise Unavailable(
                f"the node running job {job_id} did not open a stream within {OPEN_TIMEOUT_S:.0f} s "
                f"({type(exc).__name__}): retry",
                code="tunnel_timeout",
            ) from None
        finally:
            self.pending.pop(stream_id, None)
        return stream
