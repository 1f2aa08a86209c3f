"""The control plane's end of the nodes' tunnels (contracts/tunnel.py, docs/job-urls.md).

Each node's minion holds one WebSocket to TUNNEL_ROUTE; the hub keeps it by node id. `open` asks that
node for a TCP stream to a worker's port (a StreamOpen on its tunnel) and waits for the node to open the
stream's own WebSocket, which `arrived` hands over. A TunnelStream is then read and written like a socket,
its bytes the binary messages of that WebSocket.

The hub lives in the process the node's tunnel reached. With `provision serve --workers N` the tunnel and
the stream may each reach another process than the request: the hub's relay (api/tunnel_relay.py) sends
the StreamOpen through the process holding the tunnel and brings the stream to the one that asked, which
the stream id names (its first RELAY_TAG_LENGTH characters).

Streams are counted per job and per source address, so one client opening thousands of connections is
refused (429) before it takes a node's tunnel or another job's share."""

from __future__ import annotations

import asyncio
import secrets
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Final, Protocol

from starlette.websockets import WebSocket, WebSocketState

from contracts.errors import RigbaseError, Unavailable
from contracts.tunnel import StreamOpen

OPEN_TIMEOUT_S: Final = 10.0
RELAY_TAG_LENGTH: Final = 8  # a process's tag at the head of the stream ids it asks for


class TooManyStreams(RigbaseError):
    default_code = "too_many_connections"


class StreamRefused(Unavailable):
    """The node could not reach the worker's port: its reason, in one line."""


class TunnelStream(Protocol):
    """One TCP connection to a worker's port: bytes until b"" (the node closed it, with close_code)."""

    close_code: int | None
    close_reason: str
    done: asyncio.Event  # set by aclose: whoever holds the stream's WebSocket closes it then

    async def read(self) -> bytes: ...

    async def write(self, data: bytes) -> None: ...

    async def aclose(self) -> None: ...


@dataclass
class NodeStream:
    """A TunnelStream over the stream's WebSocket, as the node opened it to this process."""

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


class Relay(Protocol):
    """The sibling processes of `serve --workers N` (api/tunnel_relay.py)."""

    tag: str

    async def send_open(self, node_id: str, opening: StreamOpen) -> bool: ...

    async def holds(self, node_id: str) -> bool: ...

    async def deliver(self, node_id: str, stream_id: str, stream: TunnelStream) -> bool: ...


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
    relay: Relay | None = None

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

    async def reachable(self, node_id: str) -> bool:
        """The node's tunnel is held by this process or, under `--workers N`, by a sibling."""
        return self.connected(node_id) or (self.relay is not None and await self.relay.holds(node_id))

    def asked_here(self, stream_id: str) -> bool:
        """The stream id is one this process asked for (or there are no siblings to ask)."""
        return self.relay is None or stream_id.startswith(self.relay.tag)

    def waits_for(self, node_id: str, stream_id: str) -> bool:
        waiting = self.pending.get(stream_id)
        return waiting is not None and waiting[0] == node_id and not waiting[1].done()

    def arrived(self, node_id: str, stream_id: str, stream: TunnelStream) -> bool:
        """Hand over the stream a node opened for a StreamOpen of ours; False for one nobody waits for
        (late, or not asked of this node)."""
        if not self.waits_for(node_id, stream_id):
            return False
        self.pending[stream_id][1].set_result(stream)
        return True

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
        stream_id = (self.relay.tag if self.relay is not None else "") + secrets.token_urlsafe(24)
        future: asyncio.Future[TunnelStream] = asyncio.get_running_loop().create_future()
        self.pending[stream_id] = (node_id, future)
        try:
            opening = StreamOpen(stream_id=stream_id, job_id=job_id, worker=worker, port=port)
            if not await self._send(node_id, opening):
                raise Unavailable(
                    f"the node running job {job_id} has no tunnel to this control plane: its minion "
                    "reconnects by itself within a minute; retry then",
                    code="tunnel_down",
                )
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

    async def _send(self, node_id: str, opening: StreamOpen) -> bool:
        """The StreamOpen down the node's tunnel: here, else through the sibling that holds it."""
        if await self.send_here(node_id, opening):
            return True
        return self.relay is not None and await self.relay.send_open(node_id, opening)

    async def send_here(self, node_id: str, opening: StreamOpen) -> bool:
        """A sibling's StreamOpen, down the tunnel this process holds; False when it holds none."""
        link = self.links.get(node_id)
        if link is None:
            return False
        async with link.lock:
            await link.ws.send_text(opening.model_dump_json())
        return True
