"""/v1/nodes: add, list (keyset pages of at most 500), show, remove, replace, maintenance, history."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from provisioner.api.deps import Db, Operator
from provisioner.api.node_page import nodes_page_json
from provisioner.api.schemas import EventOut, MaintenanceIn, NodeIn, NodeOut, Page, ReplaceIn
from provisioner.domain.pages import NODES_PAGE
from provisioner.services.fleet import nodes as service

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


@router.get("", response_model=Page[NodeOut])
def list_nodes(
    session: Db,
    region: str | None = None,
    limit: Annotated[int, Query(ge=1, le=NODES_PAGE)] = 100,
    after: str | None = None,
    include_removed: bool = False,
    node_service: Annotated[str | None, Query(alias="service", description="compute, storage or device")] = (
        None
    ),
) -> Response:
    rows, cursor = service.list_page(
        session,
        region=region,
        limit=limit,
        after=after,
        include_removed=include_removed,
        service=node_service,
    )
    # written directly (the reports spliced in as stored): FastAPI would validate and re-encode them
    return Response(nodes_page_json(rows, cursor), media_type="application/json")


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
