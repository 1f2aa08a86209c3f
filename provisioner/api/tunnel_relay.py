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

Several hosts (`serve --peer-address ADDR`): each process also listens on ADDR over TLS (the host's own
server certificate, which then names ADDR) and says where in the store (services/common/relay_peers.py).
The same routes are asked of the other hosts' processes there, with a bearer token derived from the
deployment's shared secret key, so a job's URL answers through whichever host holds its node's tunnel
and a node stream that reached a third host finds its asker.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import secrets
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any, Final

from websockets.asyncio.client import ClientConnection, connect, unix_connect
from websockets.asyncio.server import Server, ServerConnection, serve, unix_serve
from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.http11 import Request, Response

from contracts.tunnel import StreamOpen
from provisioner.api.tunnel_hub import RELAY_TAG_LENGTH, TunnelHub, TunnelStream

ASK_TIMEOUT_S: Final = 5.0
PEERS_FRESH_S: Final = 2.0  # how long a read of the store's peers is reused before it is read again
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


Target = Path | str  # a sibling's Unix socket on this host, or another host's process's wss:// URL


@dataclass(frozen=True)
class PeerLink:
    """How this process reaches the other hosts' processes, and they it (`serve --peer-address`)."""

    host: str  # the address they reach this host at
    port: int  # 0: a free one
    server_tls: ssl.SSLContext  # the host's server certificate, naming `host`
    client_tls: ssl.SSLContext  # the CA the deployment's certificates chain to
    token: str  # from the deployment's shared secret key: only its own hosts hold it
    renew: Callable[[str, str], None]  # (tag, url): say this process lives (relay_peers.renew)
    forget: Callable[[str], None]  # (tag): it stops
    living: Callable[[str], dict[str, str]]  # (own tag) → the others' tag → URL
    renew_every_s: float = 10.0


class TunnelRelay:
    """This process's end: its socket(s), and what it asks of its siblings and peers for the hub."""

    def __init__(self, directory: Path | None, hub: TunnelHub, peers: PeerLink | None = None) -> None:
        self.directory = directory
        self.hub = hub
        self.peers = peers
        self.tag = secrets.token_hex(RELAY_TAG_LENGTH // 2)
        self.path = directory / f"{self.tag}.sock" if directory is not None else None
        self.url: str | None = None  # where the other hosts reach this process
        self._servers: list[Server] = []
        self._renewer: asyncio.Task[None] | None = None
        self._remote: dict[str, str] = {}
        self._remote_at = float("-inf")

    async def start(self) -> None:
        if self.path is not None:
            self._servers.append(
                await unix_serve(self._serve, str(self.path), max_size=None, compression=None)
            )
        if self.peers is not None:
            listening = await serve(
                self._serve, self.peers.host, self.peers.port, ssl=self.peers.server_tls,
                process_request=self._authorised, max_size=None, compression=None,
            )  # fmt: skip
            self._servers.append(listening)
            port = next(iter(listening.sockets)).getsockname()[1]
            host = f"[{self.peers.host}]" if ":" in self.peers.host else self.peers.host
            self.url = f"wss://{host}:{port}"
            await asyncio.to_thread(self.peers.renew, self.tag, self.url)
            self._renewer = asyncio.create_task(self._keep_renewing())
        self.hub.relay = self

    async def stop(self) -> None:
        self.hub.relay = None
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
        if self.peers is not None:
            with contextlib.suppress(Exception):  # the store may be gone first: the row then ages out
                await asyncio.to_thread(self.peers.forget, self.tag)
        for server in self._servers:
            server.close()
            await server.wait_closed()
        if self.path is not None:
            self.path.unlink(missing_ok=True)

    async def _keep_renewing(self) -> None:
        assert self.peers is not None and self.url is not None
        while True:
            await asyncio.sleep(self.peers.renew_every_s)
            with contextlib.suppress(Exception):  # a store that is away: renewed at the next round
                await asyncio.to_thread(self.peers.renew, self.tag, self.url)

    def _authorised(self, conn: ServerConnection, request: Request) -> Response | None:
        """A request on the peers' port carries the deployment's relay token (a Unix sibling's is never
        asked: only this server's processes can open that directory)."""
        assert self.peers is not None
        given = request.headers.get("Authorization", "")
        if hmac.compare_digest(given.encode(), f"Bearer {self.peers.token}".encode()):
            return None
        return conn.respond(HTTPStatus.UNAUTHORIZED, "not a host of this deployment\n")

    # -- asking the siblings and peers ----------------------------------------------------------------
    def _siblings(self) -> list[Path]:
        if self.directory is None:
            return []
        return [p for p in self.directory.glob("*.sock") if p != self.path]

    async def _peers(self, fresh: bool = False) -> dict[str, str]:
        """The other hosts' processes (tag → URL), read from the store at most every PEERS_FRESH_S."""
        if self.peers is None:
            return {}
        if fresh or time.monotonic() - self._remote_at > PEERS_FRESH_S:
            with contextlib.suppress(Exception):  # a store that is away: the last list serves
                self._remote = await asyncio.to_thread(self.peers.living, self.tag)
                self._remote_at = time.monotonic()
        return self._remote

    async def _targets(self) -> list[Target]:
        local = self._siblings()
        here = {p.stem for p in local}  # this host's processes are reached over their sockets
        remote = [url for tag, url in (await self._peers()).items() if tag not in here]
        return [*local, *remote]

    def _connect(self, target: Target, route: str, **options: Any) -> Any:
        if isinstance(target, Path):
            return unix_connect(str(target), uri=f"ws://relay{route}", compression=None, **options)
        assert self.peers is not None
        return connect(
            f"{target}{route}", ssl=self.peers.client_tls, compression=None, open_timeout=ASK_TIMEOUT_S,
            additional_headers={"Authorization": f"Bearer {self.peers.token}"}, **options,
        )  # fmt: skip

    async def _ask(self, target: Target, route: str, message: str) -> str | None:
        try:
            async with asyncio.timeout(ASK_TIMEOUT_S):
                async with self._connect(target, route) as conn:
                    await conn.send(message)
                    answer = await conn.recv()
        except (OSError, TimeoutError, ConnectionClosed, InvalidHandshake):
            return None  # a sibling or peer that stopped, or one that does not hold the node
        return answer if isinstance(answer, str) else None

    async def _ask_all(self, route: str, message: str, wanted: str) -> bool:
        targets = await self._targets()
        answers = await asyncio.gather(*(self._ask(t, route, message) for t in targets))
        return wanted in answers

    async def send_open(self, node_id: str, opening: StreamOpen) -> bool:
        return await self._ask_all(f"/send/{node_id}", opening.model_dump_json(), SENT)

    async def holds(self, node_id: str) -> bool:
        return await self._ask_all(f"/holds/{node_id}", "", YES)

    async def _asker(self, tag: str) -> Target | None:
        if tag == self.tag:
            return None
        if self.directory is not None and (path := self.directory / f"{tag}.sock").exists():
            return path
        # a process that started since the last read is read afresh: it is the one that asked
        return (await self._peers()).get(tag) or (await self._peers(fresh=True)).get(tag)

    async def deliver(self, node_id: str, stream_id: str, stream: TunnelStream) -> bool:
        """Pipe a node stream that reached this process to the process that asked for it (on this host
        or another), until either side closes; False when none waits for it."""
        target = await self._asker(stream_id[:RELAY_TAG_LENGTH])
        if target is None:
            return False
        try:
            async with self._connect(target, f"/arrive/{node_id}/{stream_id}", max_size=None) as conn:
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
