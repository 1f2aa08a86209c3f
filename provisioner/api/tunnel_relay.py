"""The node tunnels across the processes of one `provision serve --workers N` (docs/job-urls.md).

A node's tunnel reaches one of the N processes, a request for its job's URL may reach another, and the
node's stream WebSocket for that request a third. Each process therefore listens on a Unix socket of its
own, in a directory only this server's processes share (0700, made by the parent), and speaks WebSocket
on it (the websockets library) to its siblings:

- `/send/NODE`: one message, a StreamOpen; the process holding NODE's tunnel sends it down and answers
  SENT. A process asks every sibling at once; only the holder answers SENT.
- `/holds/NODE`: YES or NO, for `job url`'s `connected`.
- `/arrive/NODE/STREAM`: a node opened STREAM's WebSocket at a process that did not ask for it; that
  process pipes it here, to the one the stream id names (its first RELAY_TAG_LENGTH characters are the
  asker's tag, its socket's name). The asker answers TAKEN, then the connection's bytes are binary
  messages both ways, and the node's close code comes along as this WebSocket's close code.

The request, its limits and its proxying stay in the process the client reached; the others only carry.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from websockets.asyncio.client import ClientConnection, unix_connect
from websockets.asyncio.server import Server, ServerConnection, unix_serve
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from contracts.tunnel import StreamOpen
from provisioner.api.tunnel_hub import RELAY_TAG_LENGTH, TunnelHub, TunnelStream

ASK_TIMEOUT_S: Final = 5.0
SENT: Final = "sent"
YES, NO = "yes", "no"
TAKEN: Final = "taken"
_SENDABLE = range(3000, 5000)  # close codes an application may send; the nodes' CLOSE_* among them


def _close_code(code: int | None) -> int:
    return code if code is not None and (code == 1000 or code in _SENDABLE) else 1011


@dataclass
class RelayedStream:
    """A TunnelStream whose node stream reached a sibling process, which pipes it over `conn`."""

    conn: ServerConnection
    done: asyncio.Event = field(default_factory=asyncio.Event)
    close_code: int | None = None
    close_reason: str = ""
    _eof: bool = False

    async def read(self) -> bytes:
        if self._eof:
            return b""
        try:
            message = await self.conn.recv()
        except ConnectionClosed as exc:
            self._eof = True
            self.close_code = exc.rcvd.code if exc.rcvd is not None else None
            self.close_reason = exc.rcvd.reason if exc.rcvd is not None else ""
            return b""
        return message if isinstance(message, bytes) else message.encode()

    async def write(self, data: bytes) -> None:
        try:
            await self.conn.send(data)
        except ConnectionClosed:
            raise ConnectionResetError("the node closed the stream") from None

    async def aclose(self) -> None:
        self.done.set()


class TunnelRelay:
    """This process's end: its socket, and what it asks of its siblings for the hub."""

    def __init__(self, directory: Path, hub: TunnelHub) -> None:
        self.directory = directory
        self.hub = hub
        self.tag = secrets.token_hex(RELAY_TAG_LENGTH // 2)
        self.path = directory / f"{self.tag}.sock"
        self._server: Server | None = None

    async def start(self) -> None:
        self._server = await unix_serve(self._serve, str(self.path), max_size=None, compression=None)
        self.hub.relay = self

    async def stop(self) -> None:
        self.hub.relay = None
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        self.path.unlink(missing_ok=True)

    # -- asking the siblings --------------------------------------------------------------------------
    def _siblings(self) -> list[Path]:
        return [p for p in self.directory.glob("*.sock") if p != self.path]

    async def _ask(self, path: Path, route: str, message: str) -> str | None:
        try:
            async with asyncio.timeout(ASK_TIMEOUT_S):
                async with unix_connect(str(path), uri=f"ws://relay{route}", compression=None) as conn:
                    await conn.send(message)
                    answer = await conn.recv()
        except (OSError, TimeoutError, ConnectionClosed, InvalidHandshake):
            return None  # a sibling that stopped (its socket is gone with it) or does not hold the node
        return answer if isinstance(answer, str) else None

    async def _ask_all(self, route: str, message: str, wanted: str) -> bool:
        answers = await asyncio.gather(*(self._ask(p, route, message) for p in self._siblings()))
        return wanted in answers

    async def send_open(self, node_id: str, opening: StreamOpen) -> bool:
        return await self._ask_all(f"/send/{node_id}", opening.model_dump_json(), SENT)

    async def holds(self, node_id: str) -> bool:
        return await self._ask_all(f"/holds/{node_id}", "", YES)

    async def deliver(self, node_id: str, stream_id: str, stream: TunnelStream) -> bool:
        """Pipe a node stream that reached this process to the sibling that asked for it, until either
        side closes; False when no sibling waits for it."""
        path = self.directory / f"{stream_id[:RELAY_TAG_LENGTH]}.sock"
        if path == self.path or not path.exists():
            return False
        route = f"ws://relay/arrive/{node_id}/{stream_id}"
        try:
            async with unix_connect(str(path), uri=route, max_size=None, compression=None) as conn:
                if await asyncio.wait_for(conn.recv(), ASK_TIMEOUT_S) != TAKEN:
                    return False
                await _pipe(stream, conn)
        except (OSError, TimeoutError, ConnectionClosed, InvalidHandshake):
            return False
        return True

    # -- answering them ------------------------------------------------------------------------------
    async def _serve(self, conn: ServerConnection) -> None:
        parts = conn.request.path.strip("/").split("/") if conn.request is not None else []
        match parts:
            case ["send", node_id]:
                opening = StreamOpen.model_validate_json(await conn.recv())
                await conn.send(SENT if await self.hub.send_here(node_id, opening) else NO)
            case ["holds", node_id]:
                await conn.recv()
                await conn.send(YES if self.hub.connected(node_id) else NO)
            case ["arrive", node_id, stream_id] if self.hub.waits_for(node_id, stream_id):
                relayed = RelayedStream(conn)
                await conn.send(TAKEN)
                if self.hub.arrived(node_id, stream_id, relayed):
                    await relayed.done.wait()
            case _:
                await conn.close(1008, "no such relay route, or no one waits for this stream")


async def _pipe(stream: TunnelStream, conn: ClientConnection) -> None:
    """The node's stream and the asker's relay connection, both ways, the node's close code carried."""

    async def up() -> None:
        while data := await stream.read():
            await conn.send(data)
        await conn.close(_close_code(stream.close_code), stream.close_reason[:120])

    async def down() -> None:
        with contextlib.suppress(ConnectionClosed, ConnectionResetError):
            async for message in conn:
                await stream.write(message if isinstance(message, bytes) else message.encode())

    tasks = [asyncio.create_task(up()), asyncio.create_task(down())]
    await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
