"""The console's pages (GET): sign-in, providers and regions, a region's dashboard (its devices with
their configuration and inference status), pending minions, a node, join refusals, and the confirmation
pages of removals (jobs: job_pages.py; billing: billing_pages.py). Each reads through the same services
as the API routes of the same data (provisioner/api/routes/), in a unit of work scoped to the user's
account as the API's fleet routes are (render.reading(fleet=…), store/row_scope.py)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Final, Protocol
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response
from sqlalchemy.orm import Session

from contracts.errors import RigbaseError
from contracts.regional import StorageMode
from provisioner.api.console.forms import SignedIn, signer_of
from provisioner.api.console.render import ConsoleRoute, page, reading, set_cookie
from provisioner.api.console.session import SIGNIN_COOKIE, SIGNIN_MAX_AGE_S
from provisioner.api.schemas import NodeOut
from provisioner.domain import hardware_text
from provisioner.domain.pages import CONSOLE_NODES_PAGE
from provisioner.domain.states import NODE_AWAITING_MINION, Maintenance, NodeState, Service
from provisioner.providers.base import Feature, provider_for
from provisioner.services.billing import ledger
from provisioner.services.cloud import gcp as gcp_service
from provisioner.services.data import datastores
from provisioner.services.devices import device_configs as config_service
from provisioner.services.devices import device_deployments as deployment_service
from provisioner.services.fleet import nodes as node_service
from provisioner.services.fleet import pending
from provisioner.services.jobs import fleet_summary
from provisioner.services.regions import providers, reservations
from provisioner.services.regions import regions as region_service
from provisioner.store.models import Node, Region

router = APIRouter(include_in_schema=False, route_class=ConsoleRoute)

# A node's maintenance can be toggled from these states only (services/nodes.maintenance refuses the
# others); the grids offer the button where it can work. A device has no maintenance step.
DASHBOARD_DAYS = 7  # the credits-per-day table
# what a maintenance button says it does (docs/console.md)
MAINTENANCE_LABELS: Final = {Maintenance.ON: "Put in maintenance", Maintenance.OFF: "Make active"}
TOGGLEABLE = frozenset({NodeState.ACTIVE.value, NodeState.MAINTENANCE.value})


def device_section(inventory: dict[str, Any] | None) -> dict[str, Any]:
    """The inventory's `device` section ({} until the device's minion reported one), as
    `provision device show` reads it (provisioner/cli/devices.py)."""
    section = (inventory or {}).get("device")
    return section if isinstance(section, dict) else {}


def node_row(node: Node) -> dict[str, Any]:
    shown = NodeOut.of(node).readable()
    device = device_section(shown.inventory)
    return {
        "id": node.id,
        "name": node.name,
        "service": node.service,
        "state": node.state,
        "reason": node.reason,
        "online": shown.online,
        "minion_id": node.minion_id,
        "hardware": hardware_text.one_line(shown.inventory or {}),
        "last_heartbeat_at": node.last_heartbeat_at,
        "toggleable": node.state in TOGGLEABLE and node.service != Service.DEVICE,
        "model": str(device.get("model_name") or device.get("model") or "-"),
        "jetpack": str(device.get("jetpack") or "-"),
        # the direction, never a bare "toggle": a page older than the node's state cannot flip it back
        "toggle_mode": Maintenance.OFF.value if node.state == NodeState.MAINTENANCE else Maintenance.ON.value,
        "toggle_label": MAINTENANCE_LABELS[
            Maintenance.OFF if node.state == NodeState.MAINTENANCE else Maintenance.ON
        ],
    }


def device_row(session: Session, node: Node) -> dict[str, Any]:
    """A device's grid row: its node row and what it runs, as `provision device status` reads it
    (services/device_deployments.status): the configuration and revision, and the inference status."""
    status = deployment_service.status(session, node)
    latest, chosen = status["latest_revision"], status["config_revision"]
    return {
        **node_row(node),
        "config": status["config"],
        "config_revision": chosen,
        "deployed_revision": status["deployed_revision"],
        "newer": latest if latest is not None and chosen is not None and latest > chosen else None,
        # set but not deployed yet: the minion runs nothing of it until Deploy
        "inference": status["inference_status"] or ("not deployed" if status["config"] else None),
        "inference_message": status["inference_message"],
    }


@router.get("/signin", response_class=HTMLResponse)
def signin_page(request: Request, problem: str | None = None) -> Response:
    signer = signer_of(request)
    nonce_cookie = signer.new_signin_nonce()
    nonce = signer.signin_nonce(nonce_cookie)
    assert nonce is not None
    response = page(
        request,
        "signin.html",
        None,
        signin_csrf=signer.csrf_for(f"signin:{nonce}"),
        next=request.query_params.get("next", "/"),
    )
    set_cookie(response, request, SIGNIN_COOKIE, nonce_cookie, SIGNIN_MAX_AGE_S)
    return response


@router.get("/", response_class=HTMLResponse)
def resources(request: Request, who: SignedIn) -> Response:
    """The Resources Dashboard: the fleet's GPUs and jobs in numbers, what the account paid each day,
    providers, and the regions of each with their node counts."""
    with reading(request, fleet=who.principal) as session:
        shown = region_service.list_all(session)
        counts = {r.id: region_service.count_live_nodes(session, r) for r in shown}
        scope = who.principal.account_scope()
        return page(
            request,
            "resources.html",
            who,
            providers=providers.list_all(session),
            regions=shown,
            counts=counts,
            gpus=fleet_summary.fleet(session).gpus_by_type(),
            jobs=fleet_summary.jobs(session, scope),
            paid=ledger.paid_per_day(session, who.principal.account_id, DASHBOARD_DAYS),
            storage_modes=[m.value for m in StorageMode],
            physical_enabled=any(p.kind == "physical" for p in providers.list_all(session)),
        )


@dataclass(frozen=True)
class GridPage:
    """One page of a grid's rows: which rows, and where the page sits among the others."""

    items: list[Node]
    number: int  # 1-based
    pages: int
    first: int  # 1-based index of the first row shown (0: none)
    last: int
    total: int
    prev_href: str | None = None  # links to the neighbouring pages, keeping the filter and other grids' pages
    next_href: str | None = None


def page_number(asked: str | None, total: int, size: int = CONSOLE_NODES_PAGE) -> tuple[int, int]:
    """(the page shown, how many pages): `asked` is 1-based; anything else, or past the end, is the
    nearest page."""
    pages = max(1, -(-total // size))
    return (min(pages, max(1, int(asked))) if asked and asked.isdigit() else 1), pages


# a region page's paged grids: (its rows' service, the query parameter of its page, its section's anchor);
# the storage grid holds one node at most (a central region's storage node)
REGION_GRIDS: Final = (
    (Service.COMPUTE, "page", "compute"),
    (Service.DEVICE, "devices_page", "devices"),
)


def region_grids(
    request: Request, session: Session, region: Region, q: str, state: str
) -> dict[Service, GridPage]:
    """Each grid of a region page at the page asked for, read a page at a time from the store, with
    links to its neighbours that keep the filter and the other grids' pages (a grid on its first page
    is left out of the links)."""
    shown: dict[Service, GridPage] = {}
    for service, param, _ in REGION_GRIDS:
        total = region_service.count_live_nodes(session, region, service.value, q, state)
        number, pages = page_number(request.query_params.get(param), total)
        start = (number - 1) * CONSOLE_NODES_PAGE
        items = region_service.live_nodes_page(
            session,
            region,
            service.value,
            offset=start,
            limit=CONSOLE_NODES_PAGE,
            name_contains=q,
            state=state,
        )
        shown[service] = GridPage(items, number, pages, start + 1 if items else 0, start + len(items), total)

    def href(service: Service, number: int, anchor: str) -> str:
        query = {"q": q, "state": state, "page": str(shown[Service.COMPUTE].number)}
        query |= {p: str(shown[s].number) for s, p, _ in REGION_GRIDS[1:] if shown[s].number > 1}
        param = next(p for s, p, _ in REGION_GRIDS if s == service)
        return "?" + urlencode(query | {param: str(number)}) + "#" + anchor

    return {
        service: replace(
            p,
            prev_href=href(service, p.number - 1, anchor) if p.number > 1 else None,
            next_href=href(service, p.number + 1, anchor) if p.number < p.pages else None,
        )
        for (service, _, anchor), p in zip(REGION_GRIDS, shown.values(), strict=True)
    }


@router.get("/regions/{ref}", response_class=HTMLResponse)
def region_dashboard(request: Request, ref: str, who: SignedIn) -> Response:
    with reading(request, fleet=who.principal) as session:
        region = region_service.get(session, ref)
        q, state = request.query_params.get("q", "").strip()[:63], request.query_params.get("state", "")
        grids = region_grids(request, session, region, q, state)
        shown_reservations = reservations.list_all(session, region.id)
        return page(
            request,
            "region.html",
            who,
            region=region,
            q=q,
            state=state,
            node_states=[s.value for s in NodeState if s != NodeState.REMOVED],
            compute=[node_row(n) for n in grids[Service.COMPUTE].items],
            compute_page=grids[Service.COMPUTE],
            storage=[
                node_row(n)
                for n in region_service.live_nodes_page(
                    session, region, Service.STORAGE.value, offset=0, limit=10, name_contains=q, state=state
                )
            ],
            devices=[device_row(session, n) for n in grids[Service.DEVICE].items],
            devices_page=grids[Service.DEVICE],
            device_configs=config_service.list_all(session, region.id),
            # every compute node may take a reservation, whatever the grids' filter shows
            assignable=[
                {"id": node_id, "name": name}
                for node_id, name in region_service.live_node_names(session, region, Service.COMPUTE.value)
            ]
            if shown_reservations
            else [],
            datastores=datastores.list_all(session, region.id),
            reservations=shown_reservations,
            pending=[p for p in pending.pending(session) if p["region_id"] == region.id],
            central=region.storage_mode == StorageMode.CENTRAL,
            node_url=request.app.state.runtime.node_url(),
        )


@router.get("/regions/{ref}/quota", response_class=HTMLResponse)
def region_quota(request: Request, ref: str, who: SignedIn) -> Response:
    """A GCP region's quota and what it allows (services/gcp.region_quota, as `gcp quota` shows)."""
    with reading(request, fleet=who.principal) as session:
        region = region_service.get(session, ref)
        gcp_region = str((region.settings or {}).get("gcp_region") or region.name)
        problem, table = None, None
        if not provider_for(region.provider.kind).supports(Feature.QUOTA):
            problem = f"region '{region.name}' is a {region.provider.kind} region, which has no quota"
        else:
            try:
                table = gcp_service.region_quota(session, gcp_region).to_json()
            except RigbaseError as exc:
                problem = exc.message
        return page(
            request, "quota.html", who, region=region, gcp_region=gcp_region, quota=table, problem=problem
        )


@router.get("/pending", response_class=HTMLResponse)
def pending_minions(request: Request, who: SignedIn) -> Response:
    with reading(request, fleet=who.principal) as session:
        return page(request, "pending.html", who, pending=pending.pending(session))


@router.get("/nodes/{ref}", response_class=HTMLResponse)
def node_page(request: Request, ref: str, who: SignedIn) -> Response:
    with reading(request, fleet=who.principal) as session:
        node = node_service.get(session, ref, include_removed=True)
        shown = NodeOut.of(node).readable()
        _, events = node_service.history(session, node.id)
        requirements = shown.requirements or {}
        return page(
            request,
            "node.html",
            who,
            node=node,
            row=node_row(node),
            shown=shown,
            last_quote_at=node_service.last_quote_at(session, node),
            rules=[r for r in requirements.get("rules") or [] if isinstance(r, dict)],
            requirements_ok=requirements.get("ok"),
            history=events,
            refusals=[r for r in pending.refusals(session, limit=200) if r["minion_id"] == node.minion_id],
            awaiting=node.state in NODE_AWAITING_MINION,
            removed=node.state == NodeState.REMOVED,
        )


class _RegionalRow(Protocol):
    """What a removal's confirmation page needs of the row removed (a node, datastore or reservation)."""

    @property
    def id(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def region_id(self) -> str: ...


def _confirm_removal(
    request: Request, who: SignedIn, what: str, row: _RegionalRow, text: str, *, force: bool = False
) -> Response:
    """The page that asks before a removal: its button posts to /{what}s/{id}/remove (console/actions.py);
    Back returns to the row's region."""
    return page(
        request,
        "confirm.html",
        who,
        title=f"Remove {what} {row.name}",
        text=text,
        action=f"/{what}s/{row.id}/remove",
        button=f"Remove {what}",
        force=force,
        back=f"/regions/{row.region_id}",
    )


@router.get("/nodes/{ref}/remove", response_class=HTMLResponse)
def confirm_node_removal(request: Request, ref: str, who: SignedIn) -> Response:
    with reading(request, fleet=who.principal) as session:
        node = node_service.get(session, ref)
        text = (
            f"Remove {node.service} node '{node.name}' from region '{node.region.name}'? Its minion's "
            "credential stops working and the node leaves every grid; its history is kept."
        )
        return _confirm_removal(request, who, "node", node, text, force=node.service == Service.STORAGE)


@router.get("/nodes/{ref}/replace", response_class=HTMLResponse)
def replace_form(request: Request, ref: str, who: SignedIn) -> Response:
    with reading(request, fleet=who.principal) as session:
        node = node_service.get(session, ref)
        return page(request, "replace.html", who, node=node)


@router.get("/datastores/{ref}/remove", response_class=HTMLResponse)
def confirm_datastore_removal(request: Request, ref: str, who: SignedIn) -> Response:
    with reading(request, fleet=who.principal) as session:
        ds = datastores.get(session, ref)
        text = (
            f"Remove datastore '{ds.name}' ({ds.type} {ds.address}:{ds.root}) from region "
            f"'{ds.region.name}'? Jobs no longer mount it; the data on the server is not touched."
        )
        return _confirm_removal(request, who, "datastore", ds, text)


@router.get("/reservations/{ref}/remove", response_class=HTMLResponse)
def confirm_reservation_removal(request: Request, ref: str, who: SignedIn) -> Response:
    with reading(request, fleet=who.principal) as session:
        rsv = reservations.get(session, ref)
        text = (
            f"Remove reservation '{rsv.name}' ({rsv.hostname}.local:{rsv.port}/{rsv.protocol}) from "
            f"region '{rsv.region.name}'? Its node stops publishing it."
        )
        return _confirm_removal(request, who, "reservation", rsv, text)


@router.get("/refusals", response_class=HTMLResponse)
def refusals(request: Request, who: SignedIn) -> Response:
    with reading(request, fleet=who.principal) as session:
        return page(request, "refusals.html", who, refusals=pending.refusals(session, limit=200))
