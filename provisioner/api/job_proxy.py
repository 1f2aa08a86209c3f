"""A notebook's or endpoint's URL, https://CONTROL_PLANE/j/JOB_ID/ (docs/job-urls.md): HTTP requests and
WebSockets to it are carried to worker 0's server through its node's tunnel (api/tunnel_hub.py).

- HTTP: httpcore speaks HTTP/1.1 to the worker over tunnel streams (TunnelBackend is its network
  backend), keeping connections alive between requests as a reverse proxy does.
- WebSocket: the client's WebSocket is accepted here and wsproto makes a second one to the worker over a
  stream; messages are passed on both ways (Jupyter's kernels talk this way).

Who may use a URL (services/jobs/job_urls.py): a notebook needs its account's console session or an
operator token of its account; the proxy then signs in to Jupyter with the notebook's token for them,
so no one types it. A public endpoint takes anyone; a private one an operator token of its account.
The caller's token and console cookie never reach the worker. An endpoint's responses are sandboxed
(Content-Security-Policy), so a page it serves runs in an origin of its own, never the console's."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import httpcore
from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection
from starlette.websockets import WebSocketDisconnect
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    RejectConnection,
    TextMessage,
)
from wsproto.events import Request as WsRequest

from contracts.errors import RigbaseError, Unauthorized
from contracts.tunnel import CLOSE_NOT_HERE, CLOSE_REFUSED, CLOSE_UNREACHABLE
from provisioner.api.console.forms import SignInRequired, _signed_in
from provisioner.api.console.session import SESSION_COOKIE
from provisioner.api.errors import HTTP_STATUS
from provisioner.api.tunnel_hub import StreamRefused, TooManyStreams, TunnelHub, TunnelStream
from provisioner.domain.roles import Principal
from provisioner.services.accounts import accounts
from provisioner.services.jobs import job_urls
from provisioner.services.jobs.job_urls import Served

router = APIRouter(include_in_schema=False)

HOP_BY_HOP: Final = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"content-length",
    }
)
ENDPOINT_CSP: Final = b"sandbox allow-scripts allow-forms allow-popups allow-downloads"
REFUSALS: Final = frozenset({CLOSE_NOT_HERE, CLOSE_REFUSED, CLOSE_UNREACHABLE})
CHUNK: Final = 64 * 1024


# -- the tunnel as httpcore's network ------------------------------------------------------------------
class TunnelNetworkStream(httpcore.AsyncNetworkStream):
    def __init__(self, stream: TunnelStream) -> None:
        self.stream = stream

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        data = await asyncio.wait_for(self.stream.read(), timeout)
        if not data and self.stream.close_code in REFUSALS:
            raise StreamRefused(
                self.stream.close_reason or "the node refused the stream", code="worker_unreachable"
            )
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        for start in range(0, len(buffer), CHUNK):
            await asyncio.wait_for(self.stream.write(buffer[start : start + CHUNK]), timeout)

    async def aclose(self) -> None:
        await self.stream.aclose()

    def get_extra_info(self, info: str) -> Any:
        return None


@dataclass
class TunnelBackend(httpcore.AsyncNetworkBackend):
    """httpcore's connections to "hosts" that name a worker: each connection is one tunnel stream."""

    hub: TunnelHub
    routes: dict[str, tuple[str, str, int]] = field(default_factory=dict)  # host → node, job, worker

    def host_for(self, served: Served) -> str:
        key = f"{served.node_id}|{served.job_id}|{served.worker}"
        host = hashlib.sha256(key.encode()).hexdigest()[:32] + ".tunnel"
        self.routes[host] = (served.node_id, served.job_id, served.worker)
        return host

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        node_id, job_id, worker = self.routes[host]
        return TunnelNetworkStream(await self.hub.open(node_id, job_id, worker, port))

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


@dataclass
class Proxy:
    hub: TunnelHub
    backend: TunnelBackend = field(init=False)
    pool: httpcore.AsyncConnectionPool = field(init=False)

    def __post_init__(self) -> None:
        self.backend = TunnelBackend(self.hub)
        # idle connections close before a server's usual keep-alive timeout would close them under us
        self.pool = httpcore.AsyncConnectionPool(
            network_backend=self.backend, max_connections=4096, keepalive_expiry=4.0, retries=0
        )


def proxy_of(conn: HTTPConnection) -> Proxy:
    proxy: Proxy = conn.app.state.job_proxy
    return proxy


# -- who is calling ------------------------------------------------------------------------------------
def _caller(conn: HTTPConnection) -> Principal | None:
    """An operator token (Authorization: Bearer rbo_…), else a console session, else nobody."""
    header = conn.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        session = conn.app.state.sessions()
        try:
            return accounts.principal_of(session, header[7:].strip())
        finally:
            session.close()
    if SESSION_COOKIE in conn.cookies:
        try:
            return _signed_in(conn).principal  # type: ignore[arg-type]
        except SignInRequired:
            return None
    return None


def _resolve(conn: HTTPConnection, job_id: str) -> Served:
    principal = _caller(conn)
    session = conn.app.state.sessions()
    try:
        if principal is None and not job_urls.is_public(session, job_id):
            raise Unauthorized(
                "this URL needs a token of the job's project (Authorization: Bearer …) or a console "
                "session of its account: sign in at /signin",
                code="token_missing",
            )
        return job_urls.served(session, job_id, principal)
    finally:
        session.close()


def _refusal(exc: RigbaseError) -> JSONResponse:
    status = next((HTTP_STATUS[c] for c in type(exc).__mro__ if c in HTTP_STATUS), 400)
    if isinstance(exc, TooManyStreams):
        status = 429
    elif isinstance(exc, StreamRefused):
        status = 502
    return JSONResponse(exc.to_json(), status_code=status)


def _source(conn: HTTPConnection) -> str:
    return conn.client.host if conn.client else "unknown"


# -- what goes upstream --------------------------------------------------------------------------------
def _cookies_but_ours(value: bytes) -> bytes | None:
    kept = [
        c for c in value.split(b";") if c.strip() and not c.strip().startswith(SESSION_COOKIE.encode() + b"=")
    ]
    return b";".join(kept).strip() or None


def upstream_headers(conn: HTTPConnection, served: Served, prefix: str) -> list[tuple[bytes, bytes]]:
    """The client's headers for the worker: without hop-by-hop ones, its Authorization and the console's
    cookie; with the notebook's token for Jupyter, and where the request came from."""
    out: list[tuple[bytes, bytes]] = []
    for name, value in conn.headers.raw:
        lower = name.lower()
        if lower in HOP_BY_HOP or lower == b"authorization" or lower.startswith(b"sec-websocket"):
            continue
        if lower == b"cookie":
            kept = _cookies_but_ours(value)
            if kept:
                out.append((b"cookie", kept))
            continue
        out.append((lower, value))
    host = conn.headers.get("host", "")
    out.append((b"host", host.encode()))
    out += [
        (b"x-forwarded-for", _source(conn).encode()),
        (b"x-forwarded-proto", conn.url.scheme.replace("ws", "http").encode()),
        (b"x-forwarded-host", host.encode()),
        (b"x-forwarded-prefix", prefix.encode()),
    ]
    if served.token is not None:
        out.append((b"authorization", f"token {served.token}".encode()))
    return out


def _target(served: Served, conn: HTTPConnection, path: str) -> str:
    """A notebook serves under the job's path itself (base_url); an endpoint sees its own paths."""
    prefix = job_urls.job_path(served.job_id)
    target = prefix + path if served.notebook else "/" + path
    return target + (f"?{conn.url.query}" if conn.url.query else "")


# -- HTTP --------------------------------------------------------------------------------------------------
@router.api_route("/j/{job_id}", methods=["GET", "HEAD"])
async def job_root(job_id: str) -> Response:
    return RedirectResponse(f"/j/{job_id}/", status_code=308)


@router.api_route(
    "/j/{job_id}/{path:path}", methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
)
async def job_http(request: Request, job_id: str, path: str) -> Response:
    try:
        served = await run_in_threadpool(_resolve, request, job_id)
    except RigbaseError as exc:
        return _refusal(exc)
    proxy = proxy_of(request)
    host = proxy.backend.host_for(served)
    prefix = job_urls.job_path(served.job_id).rstrip("/")
    try:
        release = proxy.hub.take(served.job_id, _source(request))
    except TooManyStreams as exc:
        return _refusal(exc)
    try:
        body = await request.body()
        upstream = await proxy.pool.handle_async_request(
            httpcore.Request(
                request.method,
                httpcore.URL(
                    scheme=b"http",
                    host=host.encode(),
                    port=served.port,
                    target=_target(served, request, path).encode(),
                ),
                headers=[
                    *upstream_headers(request, served, prefix),
                    (b"content-length", str(len(body)).encode()),
                ],
                content=body,
            )
        )
    except RigbaseError as exc:
        release()
        return _refusal(exc)
    except (httpcore.ProtocolError, httpcore.NetworkError, httpcore.TimeoutException) as exc:
        release()
        return _refusal(
            StreamRefused(
                f"the worker's server closed the connection ({type(exc).__name__})", code="bad_gateway"
            )
        )
    headers = [(k.lower(), v) for k, v in upstream.headers if k.lower() not in HOP_BY_HOP]
    if not served.notebook:
        headers.append((b"content-security-policy", ENDPOINT_CSP))

    async def body_of() -> AsyncIterator[bytes]:
        try:
            async for chunk in upstream.aiter_stream():
                yield chunk
        finally:  # also when the client went away mid-body and the background task never runs
            release()

    async def done() -> None:
        try:
            await upstream.aclose()
        finally:
            release()

    response = StreamingResponse(body_of(), status_code=upstream.status, background=BackgroundTask(done))
    response.raw_headers = [h for h in response.raw_headers if h[0] != b"content-type"] + headers
    return response


# -- WebSocket ---------------------------------------------------------------------------------------------
@router.websocket("/j/{job_id}/{path:path}")
async def job_websocket(ws: WebSocket, job_id: str, path: str) -> None:
    try:
        served = await run_in_threadpool(_resolve, ws, job_id)
    except RigbaseError as exc:
        await ws.close(code=1008, reason=exc.message[:120])
        return
    proxy = proxy_of(ws)
    try:
        with proxy.hub.admit(served.job_id, _source(ws)):
            stream = await proxy.hub.open(served.node_id, served.job_id, served.worker, served.port)
            try:
                await _bridge_websocket(ws, served, stream, _target(served, ws, path))
            finally:
                await stream.aclose()
    except RigbaseError as exc:
        await _close(ws, 1011 if not isinstance(exc, TooManyStreams) else 1013, exc.message)


async def _close(ws: WebSocket, code: int, reason: str) -> None:
    try:
        await ws.close(code=code, reason=reason[:120])
    except RuntimeError:  # already closed
        pass


async def _bridge_websocket(ws: WebSocket, served: Served, stream: TunnelStream, target: str) -> None:
    bridge = WebSocketBridge(ws, stream)
    await bridge.handshake(served, target)
    tasks = [asyncio.create_task(bridge.from_client()), asyncio.create_task(bridge.from_worker())]
    _done, rest = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in rest:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@dataclass
class WebSocketBridge:
    """The client's WebSocket (accepted here) and wsproto's client WebSocket to the worker over `stream`."""

    ws: WebSocket
    stream: TunnelStream
    conn: WSConnection = field(default_factory=lambda: WSConnection(ConnectionType.CLIENT))
    pending: list[Any] = field(default_factory=list)  # events that came with the handshake's answer
    text: list[str] = field(default_factory=list)
    binary: list[bytes] = field(default_factory=list)

    async def handshake(self, served: Served, target: str) -> None:
        """The worker's handshake first: the client is accepted with the subprotocol the worker chose."""
        prefix = job_urls.job_path(served.job_id).rstrip("/")
        headers = [(k, v) for k, v in upstream_headers(self.ws, served, prefix) if k != b"host"]
        request = WsRequest(
            host=self.ws.headers.get("host", "localhost"),
            target=target,
            subprotocols=list(self.ws.scope.get("subprotocols") or []),
            extra_headers=headers,
        )
        await self.stream.write(self.conn.send(request))
        accepted: AcceptConnection | None = None
        while accepted is None:
            data = await self.stream.read()
            if not data:
                raise StreamRefused(self.stream.close_reason or "the worker's server closed the connection")
            self.conn.receive_data(data)
            for event in self.conn.events():
                if isinstance(event, RejectConnection):
                    raise StreamRefused(
                        f"the worker's server refused the WebSocket (HTTP {event.status_code})"
                    )
                if accepted is not None:
                    self.pending.append(event)
                elif isinstance(event, AcceptConnection):
                    accepted = event
        await self.ws.accept(subprotocol=accepted.subprotocol)

    async def from_client(self) -> None:
        try:
            while True:
                message = await self.ws.receive()
                if message["type"] == "websocket.disconnect":
                    await self.stream.write(self.conn.send(CloseConnection(code=message.get("code") or 1000)))
                    return
                if message.get("text") is not None:
                    await self.stream.write(self.conn.send(TextMessage(data=message["text"])))
                elif message.get("bytes") is not None:
                    await self.stream.write(self.conn.send(BytesMessage(data=message["bytes"])))
        except (ConnectionResetError, WebSocketDisconnect, RuntimeError):
            return

    async def from_worker(self) -> None:
        events = self.pending
        while True:
            for event in events:
                if not await self._deliver(event):
                    return
            data = await self.stream.read()
            if not data:
                await _close(self.ws, 1011, self.stream.close_reason or "the worker's server went away")
                return
            self.conn.receive_data(data)
            events = list(self.conn.events())

    async def _deliver(self, event: Any) -> bool:
        """One event of the worker's WebSocket passed on; False once it closed."""
        if isinstance(event, TextMessage):
            self.text.append(event.data)
            if event.message_finished:
                await self.ws.send_text("".join(self.text))
                self.text = []
        elif isinstance(event, BytesMessage):
            self.binary.append(bytes(event.data))
            if event.message_finished:
                await self.ws.send_bytes(b"".join(self.binary))
                self.binary = []
        elif isinstance(event, Ping):
            await self.stream.write(self.conn.send(event.response()))
        elif isinstance(event, CloseConnection):
            await _close(self.ws, event.code or 1000, event.reason or "")
            return False
        return True
