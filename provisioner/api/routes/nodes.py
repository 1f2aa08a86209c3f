"""/v1/nodes: add, list (keyset pages of at most 500), show, remove, replace, maintenance, history."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from provisioner.api.deps import OPERATOR_TOKEN, Credentials, Db, Operator, admitted
from provisioner.api.errors import OPERATOR_ERRORS
from provisioner.api.node_page import nodes_page_json
from provisioner.api.schemas import EventOut, MaintenanceIn, NodeIn, NodeOut, Page, ReplaceIn
from provisioner.services import accounts
from provisioner.services import nodes as service

router = APIRouter(prefix="/v1/nodes", tags=["nodes"])


@router.post("", status_code=201)
def add(body: NodeIn, session: Db, actor: Operator) -> NodeOut:
    node = service.add(
        session,
        body.name,
        region=body.region,
        minion_id=body.minion_id,
        service=body.service,
        hostname=body.hostname,
        upnp=body.upnp,
        mining=body.mining,
        actor=actor,
    )
    return NodeOut.of(node)


# The fleet's page (the console and `provision node list --watch` poll it, 500 nodes a page): its whole
# unit of work — the operator token's check, the read, the JSON, the commit — runs in ONE hop to the
# worker-thread pool, as the heartbeat's does (routes/join.py). Through the router's `Operator` and `Db`
# dependencies and a sync handler it took three, and a page of 500 measured ~2 ms (about a tenth) more in
# process. So it is on a router of its own, which the app includes without the operator routers'
# dependency (app.py SELF_AUTHENTICATED_ROUTERS); same security scheme, same answers, same OpenAPI operation.
page_router = APIRouter(prefix="/v1/nodes", tags=["nodes"])


@dataclass(frozen=True)
class PageQuery:
    """A list request's filters, as its query string gave them."""

    region: str | None
    limit: int
    after: str | None
    include_removed: bool
    service: str | None


@page_router.get("", response_model=Page[NodeOut], responses=OPERATOR_ERRORS)
async def list_nodes(
    request: Request,
    bearer: Annotated[Credentials, Depends(OPERATOR_TOKEN)],
    region: str | None = None,
    limit: Annotated[int, Query(ge=1, le=service.MAX_PAGE)] = 100,
    after: str | None = None,
    include_removed: bool = False,
    node_service: Annotated[str | None, Query(alias="service", description="compute, storage or device")] = (
        None
    ),
) -> Response:
    async with admitted(request):  # one of the units of work the pool and the threads can carry
        page = await run_in_threadpool(
            _page,
            request.app.state.sessions,
            bearer.credentials if bearer else None,
            PageQuery(region, limit, after, include_removed, node_service),
        )
    # written directly (the reports spliced in as stored): FastAPI would validate and re-encode them
    return Response(page, media_type="application/json")


def _page(sessions: sessionmaker[Session], token: str | None, query: PageQuery) -> str:
    """The page's unit of work: who asks (401 as for every operator route), the rows, their JSON."""
    with sessions.begin() as session:
        accounts.principal_of(session, token)
        rows, cursor = service.list_page(
            session,
            region=query.region,
            limit=query.limit,
            after=query.after,
            include_removed=query.include_removed,
            service=query.service,
        )
        return nodes_page_json(rows, cursor)


@router.get("/{ref}")
def show(ref: str, session: Db, region: str | None = None) -> NodeOut:
    node = service.get(session, ref, region)
    shown = NodeOut.of(node).readable()
    return shown.model_copy(
        update={
            "last_quote_at": service.last_quote_at(session, node),
            "identity": service.identity(session, node),
        }
    )


@router.delete("/{ref}")
def remove(ref: str, session: Db, actor: Operator, region: str | None = None, force: bool = False) -> NodeOut:
    """`force`: remove a storage node even while compute nodes of its region use its cache."""
    return NodeOut.of(service.remove(session, ref, region=region, actor=actor, force=force))


@router.post("/{ref}/replace", status_code=201)
def replace(ref: str, body: ReplaceIn, session: Db, actor: Operator, region: str | None = None) -> NodeOut:
    return NodeOut.of(service.replace(session, ref, minion_id=body.minion_id, region=region, actor=actor))


@router.post("/{ref}/maintenance")
def maintenance(
    ref: str, body: MaintenanceIn, session: Db, actor: Operator, region: str | None = None
) -> NodeOut:
    return NodeOut.of(
        service.maintenance(session, ref, body.mode, region=region, actor=actor, reason=body.reason)
    )


@router.get("/{ref}/history")
def history(ref: str, session: Db, region: str | None = None) -> Page[EventOut]:
    _, events = service.history(session, ref, region)
    return Page(items=[EventOut.of(e) for e in events])
