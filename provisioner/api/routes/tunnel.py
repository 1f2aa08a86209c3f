"""The tunnel's routes (contracts/tunnel.py, docs/job-urls.md): the node's tunnel and its streams (node
credential), `provision job connect`'s byte stream to a worker's port, and a job's URL (operator token)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Annotated, Any

from anyio import from_thread
from fastapi import APIRouter, Query, Request, WebSocket
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool
from starlette.websockets import WebSocketDisconnect, WebSocketState

from contracts.errors import Conflict, RigbaseError, RuleViolation
from contracts.tunnel import STREAM_ROUTE, TUNNEL_ROUTE
from provisioner.api.deps import Db, Principal
from provisioner.api.errors import documented
from provisioner.api.job_proxy import proxy_of
from provisioner.api.tunnel_hub import NodeStream, TooManyStreams, TunnelStream
from provisioner.services.accounts import accounts
from provisioner.services.fleet import node_credentials
from provisioner.services.jobs import job_urls
from provisioner.services.jobs import jobs as job_service

node_router = APIRouter(tags=["tunnel"])  # node credential auth (the app's OPEN_ROUTERS)
connect_router = APIRouter(tags=["jobs"])  # an operator token, read from the WebSocket's headers
router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


def _bearer(ws: WebSocket) -> str | None:
    header = ws.headers.get("authorization", "")
    return header[7:].strip() if header.lower().startswith("bearer ") else None


def _node_of(ws: WebSocket, node_id: str) -> None:
    session = ws.app.state.sessions()
    try:
        node_credentials.node_for_credential(session, node_id, _bearer(ws))
    finally:
        session.close()


async def _authenticated(ws: WebSocket, node_id: str) -> bool:
    try:
        await run_in_threadpool(_node_of, ws, node_id)
    except RigbaseError as exc:
        await ws.close(code=1008, reason=exc.message[:120])
        return False
    return True


@node_router.websocket(TUNNEL_ROUTE)
async def node_tunnel(ws: WebSocket, node_id: str) -> None:
    """The node's tunnel: StreamOpen messages go down it; nothing comes up but pings."""
    if not await _authenticated(ws, node_id):
        return
    await ws.accept()
    hub = proxy_of(ws).hub
    link = hub.attach(node_id, ws)
    try:
        while (await ws.receive())["type"] != "websocket.disconnect":
            pass
    finally:
        hub.detach(node_id, link)


@node_router.websocket(STREAM_ROUTE)
async def node_stream(ws: WebSocket, node_id: str, stream_id: str) -> None:
    """One stream the node opened for a StreamOpen: held open until the proxy is done with it."""
    if not await _authenticated(ws, node_id):
        return
    await ws.accept()
    hub, stream = proxy_of(ws).hub, NodeStream(ws)
    if hub.asked_here(stream_id):
        taken = hub.arrived(node_id, stream_id, stream)
        if taken:
            await stream.done.wait()
    else:  # another process of `serve --workers N` asked for it: carried there (api/tunnel_relay.py)
        taken = hub.relay is not None and await hub.relay.deliver(node_id, stream_id, stream)
    if not taken:
        await ws.close(code=1008, reason="no one waits for this stream")
        return
    try:
        await ws.close()
    except RuntimeError:  # the node closed it first
        pass


# -- provision job connect ---------------------------------------------------------------------------------
def _connect_target(ws: WebSocket, ref: str) -> tuple[str, str]:
    session = ws.app.state.sessions()
    try:
        principal = accounts.principal_of(session, _bearer(ws))
        job = job_service.get(session, principal, ref)
        if not job_urls.may_use(principal, job):
            raise RuleViolation(
                f"job '{job.name}' is another account's: only its own account may connect to it",
                code="not_your_job",
            )
        return job_urls.served_worker(session, job), job.id
    finally:
        session.close()


@connect_router.websocket("/v1/jobs/{ref}/connect")
async def job_connect(ws: WebSocket, ref: str, port: Annotated[int, Query(ge=1, le=65535)]) -> None:
    """One TCP connection to `port` of the job's worker 0, its bytes as binary messages both ways."""
    try:
        node_id, job_id = await run_in_threadpool(_connect_target, ws, ref)
    except RigbaseError as exc:
        await _refuse(ws, 1008, exc.message)
        return
    hub = proxy_of(ws).hub
    source = ws.client.host if ws.client else "unknown"
    try:
        with hub.admit(job_id, source):
            stream = await hub.open(node_id, job_id, 0, port)
            await ws.accept()
            try:
                await _bridge_bytes(ws, stream)
            finally:
                await stream.aclose()
    except TooManyStreams as exc:
        await _refuse(ws, 1013, exc.message)
    except RigbaseError as exc:
        await _refuse(ws, 1011, exc.message)


async def _refuse(ws: WebSocket, code: int, message: str) -> None:
    """Closed with the reason, `provision job connect` prints it: a WebSocket closed before its handshake
    is answered would only be a bare HTTP 403, so the refusal accepts it first."""
    with contextlib.suppress(RuntimeError):  # the client went first
        if ws.application_state is WebSocketState.CONNECTING:
            await ws.accept()
        await ws.close(code=code, reason=message[:120])


async def _bridge_bytes(ws: WebSocket, stream: TunnelStream) -> None:
    async def from_client() -> None:
        try:
            while True:
                message = await ws.receive()
                if message["type"] == "websocket.disconnect":
                    return
                await stream.write(message.get("bytes") or (message.get("text") or "").encode())
        except (ConnectionResetError, WebSocketDisconnect, RuntimeError):
            return

    async def from_worker() -> None:
        while data := await stream.read():
            await ws.send_bytes(data)
        try:
            await ws.close(
                code=1000 if stream.close_code in (None, 1000) else 1011, reason=stream.close_reason[:120]
            )
        except RuntimeError:
            pass

    tasks = [asyncio.create_task(from_client()), asyncio.create_task(from_worker())]
    await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


# -- a job's URL ---------------------------------------------------------------------------------------------
class JobUrlOut(BaseModel):
    job: str
    url: str
    public: bool
    ready: bool
    reason: str | None = None
    token: str | None = None  # a notebook's Jupyter token, for its own account (the LAN address)
    connected: bool = False  # the node's tunnel reaches this control plane (any of its processes)


@router.get("/{ref}/url", response_model=JobUrlOut, responses=documented(409))
def job_url(request: Request, ref: str, session: Db, principal: Principal) -> Any:
    """The job's URL, whether it serves yet (and why not), and a notebook's token."""
    job = job_service.get(session, principal, ref)
    url = job_urls.url_of(str(request.base_url), job)
    if url is None:
        raise Conflict(
            f"job '{job.name}' is a {job.type} job: only notebook and endpoint jobs have a URL",
            code="job_serves_nothing",
        )
    try:
        served = job_urls.served(session, job.id, principal)
        ready, reason, node_id = True, None, served.node_id
    except RigbaseError as exc:
        ready, reason, node_id = False, exc.message, None
    return JobUrlOut(
        job=job.name,
        url=url,
        public=job_urls.is_public(session, job.id),
        ready=ready,
        reason=reason,
        token=job_urls.token_of(session, job.id)
        if job.type == "notebook" and job_urls.may_use(principal, job)
        else None,
        connected=node_id is not None and from_thread.run(proxy_of(request).hub.reachable, node_id),
    )
