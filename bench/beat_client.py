"""The fleet benchmark's load client: HTTP/1.1 POSTs over TLS keep-alive connections, written straight on
asyncio streams, byte for byte what a minion sends.

Why not httpx: on this machine the load client shares the two cores with the server under test and
PostgreSQL, so what the client spends is taken from the server. httpx (its connection pool, its request
and response models, header normalisation) cost about as much CPU per beat as the server's whole unit of
work; 10,000 real nodes would each spend that on their own machine. This client does only what a beat
needs: a request line and its headers, then a status line, `Content-Length` and the body, at a third of
the CPU or less. TLS, keep-alive and the server's HTTP handling are
the same as with any client, so the server's side of the measurement is unchanged; the benchmark prints
the client's CPU per beat (`--client httpx` keeps the old one for an A/B).

So that the figure is the fleet's, the bytes are the minion's own: the request head is the one the
minion's httpx client builds (`minion.join.client.ControlPlane`, serialised by h11 as httpcore does), the
body is httpx's JSON encoding, a connection resumes its TLS session through the minion's own context
(minion/join/tls_resume.py), and a dropped connection is closed as httpcore closes one, without a
close_notify. tests/provisioner/test_fleet_bench_client.py counts both clients' connections, handshakes
and bytes in each direction through one relay and finds them equal.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import random
import ssl
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import h11
import httpx

from minion.join.client import ControlPlane, Enrollment, connection_lifetime_s
from minion.join.tls_resume import keep_from


class BeatError(Exception):
    """A beat that got no HTTP answer (connection refused or closed, a malformed answer, a timeout)."""


class BeatClient(Protocol):
    async def post(self, path: str, body: dict[str, Any], credential: str) -> tuple[int, bytes]:
        """POST `body` as JSON with the node credential; the status and the answer's body."""
        ...

    async def aclose(self) -> None: ...


class _Connection:
    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, beats: int, asks: bool
    ) -> None:
        self.reader, self.writer = reader, writer
        self.uses, self.beats, self.asks = 0, beats, asks

    @property
    def last(self) -> bool:
        """The next beat is this connection's last and asks the server to close it (a minion letting a
        connection go at the end of its lifetime; one dropped after a fixed count just ends)."""
        return self.asks and self.beats > 0 and self.uses + 1 >= self.beats

    async def exchange(self, head: bytes, body: bytes) -> tuple[int, bytes, bool]:
        """Send one request; the status, the body, and whether the server keeps the connection open. The
        head and the body are two writes, so two TLS records, as h11 hands them to httpcore."""
        self.writer.write(head)
        self.writer.write(body)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = head[:-4].split(b"\r\n")
        status = int(status_line.split(b" ", 2)[1])
        length, keep = None, True
        for line in header_lines:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection" and value.strip().lower() == b"close":
                keep = False
            elif name == b"transfer-encoding":
                raise BeatError(f"unexpected Transfer-Encoding {value.strip().decode()!r}")
        if length is None:
            raise BeatError("an answer without Content-Length")
        return status, await self.reader.readexactly(length), keep

    @property
    def closed_by_server(self) -> bool:
        return self.reader.at_eof() or self.writer.is_closing()

    def close(self, context: ssl.SSLContext) -> None:
        """As httpcore closes a connection: the socket only, no close_notify; the session is kept first
        for the next connection to resume (a context that resumes)."""
        keep_from(context, self.writer.get_extra_info("ssl_object"))
        self.writer.transport.abort()


@dataclass(frozen=True)
class Target:
    """Where and how a client sends: the server's https URL, a TLS context trusting its CA (a
    minion.join.tls_resume.ResumingContext resumes sessions as a minion does), at most `connections` at
    once, and how many beats a connection carries before its last asks the server to close it:
    `reconnect_every` beats, or, with `lifetime_s`, as many as a minion's connection of that mean
    lifetime carries at a beat every `interval_s` (minion.join.client.ConnectionAge); 0 and 0: kept as
    long as the server keeps it. `partway`: the first connection is part-way through its life."""

    base_url: str
    verify: ssl.SSLContext
    connections: int
    timeout_s: float = 30
    reconnect_every: int = 0
    lifetime_s: float = 0
    interval_s: float = 30
    partway: bool = False


class Lifetimes:
    """How many beats each next connection carries (0: no limit). A minion's connection is first used at
    a beat and let go at the first beat at least its drawn lifetime later, which asks the server to close
    it (`asks`). With `Target.partway` the first connection is part-way through its life, as a steady
    fleet's connections are, so a short run reconnects at the fleet's steady rate and not in a burst at
    the end of the first lifetime."""

    def __init__(self, target: Target) -> None:
        self.target, self.first = target, target.partway
        self.asks = bool(target.lifetime_s and not target.reconnect_every)

    def next(self) -> int:
        if self.target.reconnect_every or not self.target.lifetime_s:
            return self.target.reconnect_every
        beats = math.ceil(connection_lifetime_s(self.target.lifetime_s) / self.target.interval_s) + 1
        if self.first:
            self.first = False
            return random.randint(1, beats)
        return beats


_PATH, _CREDENTIAL, _LENGTH = "/path-sentinel", "credential-sentinel", 987654321


@dataclass(frozen=True)
class RequestHead:
    """A heartbeat POST's head as a minion writes it, with room for the path, credential and length (its
    connection's last: with `Connection: close`)."""

    before_path: bytes
    before_credential: bytes
    before_length: bytes
    after_length: bytes

    def render(self, path: str, credential: str, length: int) -> bytes:
        return b"".join(
            (
                self.before_path,
                path.encode(),
                self.before_credential,
                credential.encode(),
                self.before_length,
                str(length).encode(),
                self.after_length,
            )
        )


@functools.cache
def minion_request_head(base_url: str, last: bool = False) -> RequestHead:
    """Built by the minion's own client (its headers, in its order) and serialised by h11, as httpcore
    writes it: the same bytes a minion puts on the wire, for any path, credential and body length."""
    minion = ControlPlane(Enrollment(base_url, None))
    request = minion.http.build_request("POST", _PATH, json={}, headers=minion.headers(_CREDENTIAL, last))
    minion.close()
    headers = [
        (name, str(_LENGTH).encode() if name.lower() == b"content-length" else value)
        for name, value in request.headers.raw
    ]
    wire = h11.Connection(h11.CLIENT).send(
        h11.Request(method="POST", target=request.url.raw_path, headers=headers)
    )
    assert wire is not None
    before_path, rest = wire.split(_PATH.encode(), 1)
    before_credential, rest = rest.split(_CREDENTIAL.encode(), 1)
    before_length, after_length = rest.split(str(_LENGTH).encode(), 1)
    return RequestHead(before_path, before_credential, before_length, after_length)


def minion_body(body: dict[str, Any]) -> bytes:
    """The body as httpx encodes `json=` (httpx._content.encode_json)."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


class StreamBeatClient:
    """At most `connections` keep-alive TLS connections to `base_url`, opened on first use and reused;
    a connection the server closed, or that failed mid-exchange, is dropped and a new one opened for
    the next request. Callers bound their own concurrency to `connections` (bench_fleet_heartbeats's
    semaphore), so a free connection or room for a new one is always there."""

    def __init__(self, target: Target) -> None:
        parts = urlsplit(target.base_url)
        if parts.scheme != "https" or parts.hostname is None:
            raise ValueError(f"{target.base_url}: the benchmark's client speaks TLS only")
        self.host, self.port = parts.hostname, parts.port or 443
        self.verify, self.timeout_s = target.verify, target.timeout_s
        self.verify.set_alpn_protocols(["http/1.1"])  # as httpcore sets it on the minion's context
        self.idle: list[_Connection] = []
        self.limit, self.open = target.connections, 0
        self.lifetimes = Lifetimes(target)
        self.head = minion_request_head(target.base_url)
        self.last_head = minion_request_head(target.base_url, last=True)

    async def _connection(self) -> _Connection:
        while self.idle:
            connection = self.idle.pop()
            if not connection.closed_by_server:
                return connection
            # uvicorn closes a keep-alive connection idle for 5 s; httpx's pool drops such a connection
            # the same way before it sends on it
            self.open -= 1
            connection.close(self.verify)
        if self.open >= self.limit:
            raise BeatError(f"more than {self.limit} requests at once")
        self.open += 1
        try:
            reader, writer = await asyncio.open_connection(
                self.host, self.port, ssl=self.verify, server_hostname=self.host
            )
        except BaseException:
            self.open -= 1
            raise
        return _Connection(reader, writer, self.lifetimes.next(), self.lifetimes.asks)

    async def post(self, path: str, body: dict[str, Any], credential: str) -> tuple[int, bytes]:
        payload = minion_body(body)
        try:
            connection = await self._connection()
        except (OSError, ssl.SSLError) as exc:
            raise BeatError(f"connect: {exc}") from exc
        head = (self.last_head if connection.last else self.head).render(path, credential, len(payload))
        try:
            status, answer, keep = await asyncio.wait_for(connection.exchange(head, payload), self.timeout_s)
        except (
            OSError,
            ssl.SSLError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            TimeoutError,
            ValueError,
            BeatError,
        ) as exc:
            self.open -= 1
            connection.close(self.verify)
            raise BeatError(f"{type(exc).__name__}: {exc}") from exc
        if connection.uses == 0:
            note = getattr(self.verify, "note", None)
            if note is not None:  # a resuming context counts the connection once its handshake is done
                note(connection.writer.get_extra_info("ssl_object"))
        connection.uses += 1
        if keep and not (connection.beats and connection.uses >= connection.beats):
            self.idle.append(connection)
        else:
            self.open -= 1
            connection.close(self.verify)
        return status, answer

    async def aclose(self) -> None:
        for connection in self.idle:
            connection.close(self.verify)
        self.idle.clear()


class HttpxBeatClient:
    """The same requests through httpx.AsyncClient: the client the benchmark used before, for an A/B."""

    def __init__(self, target: Target) -> None:
        limits = httpx.Limits(max_connections=target.connections)
        self.client = httpx.AsyncClient(
            base_url=target.base_url,
            verify=target.verify,
            limits=limits,
            timeout=httpx.Timeout(target.timeout_s, pool=60),
        )
        # one connection at a time (PerNodeClient): its beats counted here
        self.lifetimes, self.uses = Lifetimes(target), 0
        self.beats = self.lifetimes.next()

    async def post(self, path: str, body: dict[str, Any], credential: str) -> tuple[int, bytes]:
        self.uses += 1
        last = self.beats > 0 and self.uses >= self.beats
        headers = {"Authorization": f"Bearer {credential}"}
        if last:
            headers["Connection"] = "close"  # httpx's pool lets a connection go only when told so
            self.uses, self.beats = 0, self.lifetimes.next()
        try:
            answer = await self.client.post(path, json=body, headers=headers)
        except httpx.HTTPError as exc:
            self.uses, self.beats = 0, self.lifetimes.next()
            raise BeatError(f"{type(exc).__name__}: {exc}") from exc
        return answer.status_code, answer.content

    async def aclose(self) -> None:
        await self.client.aclose()


class PerNodeClient:
    """A client per node credential, each holding at most `target.connections` (1) of its own: every
    node keeps its own connection to the server between beats, or drops and reopens it, as each minion
    does. `open`: the connections held now, over all nodes."""

    def __init__(self, target: Target, kind: type[StreamBeatClient] | type[HttpxBeatClient]) -> None:
        self.target, self.kind = target, kind
        self.clients: dict[str, StreamBeatClient | HttpxBeatClient] = {}

    async def post(self, path: str, body: dict[str, Any], credential: str) -> tuple[int, bytes]:
        client = self.clients.get(credential)
        if client is None:
            client = self.clients[credential] = self.kind(self.target)
        return await client.post(path, body, credential)

    @property
    def open(self) -> int:
        return sum(c.open for c in self.clients.values() if isinstance(c, StreamBeatClient))

    async def aclose(self) -> None:
        for client in self.clients.values():
            await client.aclose()
        self.clients.clear()


CLIENTS: dict[str, type[StreamBeatClient] | type[HttpxBeatClient]] = {
    "streams": StreamBeatClient,
    "httpx": HttpxBeatClient,
}
