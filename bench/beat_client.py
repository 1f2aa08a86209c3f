"""The fleet benchmark's load client: HTTP/1.1 POSTs over TLS keep-alive connections, written straight on
asyncio streams.

Why not httpx: on this machine the load client shares the two cores with the server under test and
PostgreSQL, so what the client spends is taken from the server. httpx (its connection pool, its request
and response models, header normalisation) cost about as much CPU per beat as the server's whole unit of
work; 10,000 real nodes would each spend that on their own machine. This client does only what a beat
needs: a request line and its headers, then a status line, `Content-Length` and the body, at a third of
the CPU or less. TLS, keep-alive and the server's HTTP handling are
the same as with any client, so the server's side of the measurement is unchanged; the benchmark prints
the client's CPU per beat (`--client httpx` keeps the old one for an A/B).
"""

from __future__ import annotations

import asyncio
import json
import ssl
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx


class BeatError(Exception):
    """A beat that got no HTTP answer (connection refused or closed, a malformed answer, a timeout)."""


class BeatClient(Protocol):
    async def post(self, path: str, body: dict[str, Any], credential: str) -> tuple[int, bytes]:
        """POST `body` as JSON with the node credential; the status and the answer's body."""
        ...

    async def aclose(self) -> None: ...


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def exchange(self, request: bytes) -> tuple[int, bytes, bool]:
        """Send one request; the status, the body, and whether the server keeps the connection open."""
        self.writer.write(request)
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

    def close(self) -> None:
        self.writer.close()


@dataclass(frozen=True)
class Target:
    """Where and how a client sends: the server's https URL, a TLS context trusting its CA, at most
    `connections` at once, and whether a connection is kept for the next beat."""

    base_url: str
    verify: ssl.SSLContext
    connections: int
    timeout_s: float = 30
    keep_alive: bool = True


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
        self.idle: list[_Connection] = []
        self.limit, self.open = target.connections, 0
        authority = self.host if self.port == 443 else f"{self.host}:{self.port}"
        self.prefix = f"Host: {authority}\r\nContent-Type: application/json\r\n" + (
            "" if target.keep_alive else "Connection: close\r\n"
        )

    async def _connection(self) -> _Connection:
        while self.idle:
            connection = self.idle.pop()
            if not connection.closed_by_server:
                return connection
            # uvicorn closes a keep-alive connection idle for 5 s; httpx's pool drops such a connection
            # the same way before it sends on it
            self.open -= 1
            connection.close()
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
        return _Connection(reader, writer)

    async def post(self, path: str, body: dict[str, Any], credential: str) -> tuple[int, bytes]:
        payload = json.dumps(body, separators=(",", ":")).encode()
        request = (
            f"POST {path} HTTP/1.1\r\n{self.prefix}Authorization: Bearer {credential}\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n"
        ).encode() + payload
        try:
            connection = await self._connection()
        except (OSError, ssl.SSLError) as exc:
            raise BeatError(f"connect: {exc}") from exc
        try:
            status, answer, keep = await asyncio.wait_for(connection.exchange(request), self.timeout_s)
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
            connection.close()
            raise BeatError(f"{type(exc).__name__}: {exc}") from exc
        if keep:
            self.idle.append(connection)
        else:
            self.open -= 1
            connection.close()
        return status, answer

    async def aclose(self) -> None:
        for connection in self.idle:
            connection.close()
        self.idle.clear()


class HttpxBeatClient:
    """The same requests through httpx.AsyncClient: the client the benchmark used before, for an A/B."""

    def __init__(self, target: Target) -> None:
        kept = target.connections if target.keep_alive else 0
        limits = httpx.Limits(max_connections=target.connections, max_keepalive_connections=kept)
        self.client = httpx.AsyncClient(
            base_url=target.base_url,
            verify=target.verify,
            limits=limits,
            timeout=httpx.Timeout(target.timeout_s, pool=60),
        )

    async def post(self, path: str, body: dict[str, Any], credential: str) -> tuple[int, bytes]:
        try:
            answer = await self.client.post(
                path, json=body, headers={"Authorization": f"Bearer {credential}"}
            )
        except httpx.HTTPError as exc:
            raise BeatError(f"{type(exc).__name__}: {exc}") from exc
        return answer.status_code, answer.content

    async def aclose(self) -> None:
        await self.client.aclose()


CLIENTS: dict[str, type[StreamBeatClient] | type[HttpxBeatClient]] = {
    "streams": StreamBeatClient,
    "httpx": HttpxBeatClient,
}
