"""The console's actions (POST): each form button calls the service the matching API route calls, with
the signed-in operator as the actor, in one unit of work (render.perform). A refusal is the API's own
one-line message, shown on the page the form was on; nothing is changed. Every fleet action needs an
admin token (a member's console reads its account's regions, as its API token does), and enabling a
provider a root admin (provisioner/domain/roles.py)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from sqlalchemy.orm import Session

from contracts.bundle import EnrollmentBundle, check_control_plane_url, refuse_loopback
from contracts.errors import InvalidInput, RigbaseError
from provisioner.adapters import tls
from provisioner.api.console.forms import (
    CSRF_REFUSAL,
    CsrfRefused,
    Posted,
    RawForm,
    SignInRequired,
    Who,
    end_session,
    principal_of_row,
    signer_of,
)
from provisioner.api.console.render import (
    ConsoleRoute,
    Done,
    clear_cookie,
    local_path,
    perform,
    reading,
    redirect,
    set_cookie,
)
from provisioner.api.console.session import SESSION_COOKIE, SESSION_MAX_AGE_S, SIGNIN_COOKIE
from provisioner.api.deps import enter_fleet
from provisioner.domain.roles import Action
from provisioner.domain.states import Maintenance, Service
from provisioner.services.accounts import tokens
from provisioner.services.data import datastores
from provisioner.services.devices import device_deployments
from provisioner.services.fleet import join_operator, join_tokens, nodes
from provisioner.services.regions import providers, regions, reservations

router = APIRouter(include_in_schema=False, route_class=ConsoleRoute)


# ------------------------------------------------------------------------------ signing in and out


@router.post("/signin")
def sign_in(request: Request, form: RawForm) -> Response:
    signer = signer_of(request)
    nonce = signer.signin_nonce(request.cookies.get(SIGNIN_COOKIE))
    if nonce is None or not signer.csrf_ok(f"signin:{nonce}", form.get("csrf")):
        raise CsrfRefused(CSRF_REFUSAL)
    session: Session = request.app.state.sessions()
    try:
        row = tokens.authenticate(session, form.get("token") or None)  # the API's checks and messages
        principal_of_row(session, row)  # a token whose account is gone is refused here, not later
        cookie = signer.new_session(row.id, row.token_sha256)
        session.commit()
    except RigbaseError as exc:
        session.rollback()
        raise SignInRequired(exc.message) from None
    finally:
        session.close()
    response = redirect(request, local_path(form.get("next")), "ok", f"signed in as operator:{row.name}")
    set_cookie(response, request, SESSION_COOKIE, cookie, SESSION_MAX_AGE_S)
    clear_cookie(response, request, SIGNIN_COOKIE)
    return response


@router.post("/signout")
def sign_out(request: Request, posted: Posted) -> Response:
    who, _ = posted
    signer_of(request).end(who.session)
    session: Session = request.app.state.sessions()
    try:
        end_session(session, who.session)
        session.commit()
    finally:
        session.close()
    response = redirect(request, "/signin", "ok", "signed out")
    clear_cookie(response, request, SESSION_COOKIE)
    return response


# ------------------------------------------------------------------------------ providers and regions


@router.post("/providers")
def enable_provider(request: Request, posted: Posted) -> Response:
    who, form = posted

    def work(session: Session) -> Done:
        who.principal.require(Action.MANAGE_TRUST)
        kind = form.required("kind", "provider")
        if kind != "physical":  # GCP needs a service-account key: `provision provider enable gcp`
            raise InvalidInput(
                f"provider '{kind}' is enabled with `provision provider enable {kind}`: the console enables "
                "physical only"
            )
        raw = {"payment_mode": form.get("payment_mode")} if form.get("payment_mode") else {}
        provider = providers.enable(session, kind, raw, actor=who.principal.actor)
        return Done(f"provider {provider.kind} is {provider.state}")

    return perform(request, "/", work)


@router.post("/regions")
def create_region(request: Request, posted: Posted) -> Response:
    who, form = posted

    def work(session: Session) -> Done:
        region = regions.create(
            session,
            form.required("name", "region name"),
            provider=form.required("provider"),
            storage_mode=form.get("storage_mode") or "local",
            public_jobs=form.flag("public_jobs"),
            actor=who.principal.actor,
            account_id=who.principal.account_id,
        )
        session.flush()
        return Done(f"region {region.name} created", f"/regions/{region.id}")

    return perform(request, "/", work, fleet=who.principal)


@router.post("/regions/{ref}/bundle")
def download_bundle(request: Request, ref: str, posted: Posted) -> Response:
    """The region's enrollment bundle (its live bundle token, or a new one for a TTL), as a file: what
    `provision region bundle -o FILE` writes, for `image-builder build` (docs/enrollment-bundle.md)."""
    who, form = posted
    settings = request.app.state.runtime.settings
    session: Session = request.app.state.sessions()
    try:
        enter_fleet(session, who.principal, changes=True)
        region = regions.get(session, ref)
        url = check_control_plane_url(form.required("control_plane_url", "control plane URL"))
        if not form.flag("allow_loopback"):
            refuse_loopback(url, "tick 'single-host test'")
        tls.check_node_url(url, settings)
        _row, token, _reused = join_tokens.for_bundle(
            session, region.id, ttl=form.get("ttl") or None, actor=who.principal.actor
        )
        made = EnrollmentBundle.model_validate(
            join_tokens.bundle(
                session, region, token, control_plane_url=url, ca_certificate=tls.node_trust(settings)
            )
        )
        name = region.name
        session.commit()
    except RigbaseError as exc:
        session.rollback()
        return redirect(request, f"/regions/{ref}", "error", exc.message)
    finally:
        session.close()
    return Response(
        made.to_json(),
        media_type="application/json",
        headers={
            "Content-Disposition": f'attachment; filename="rigbase-bundle-{name}.json"',
            "Cache-Control": "no-store",  # it holds a join token
        },
    )


# ------------------------------------------------------------------------------ nodes


@router.post("/nodes")
def add_node(request: Request, posted: Posted) -> Response:
    """Add a node by minion_id: the region dashboard's Add buttons and the pending list's Add form."""
    who, form = posted
    back = local_path(form.get("back"), "/pending")

    def work(session: Session) -> Done:
        region = regions.get(session, form.required("region"))
        node = nodes.add(
            session,
            form.required("name", "node name"),
            region=region.id,
            minion_id=form.required("minion_id", "minion_id"),
            service=form.get("service") or Service.COMPUTE.value,
            hostname=form.optional("hostname"),
            upnp=form.flag("upnp"),
            mining=form.flag("mining"),
            actor=who.principal.actor,
        )
        return Done(
            f"node {node.name} added: it is {node.state} until its minion joins and finalizes",
            f"/regions/{region.id}",
        )

    return perform(request, back, work, fleet=who.principal)


@router.post("/nodes/{ref}/maintenance")
def toggle_maintenance(request: Request, ref: str, posted: Posted) -> Response:
    who, form = posted
    back = local_path(form.get("back"), f"/nodes/{ref}")

    def work(session: Session) -> Done:
        node = nodes.get(session, ref)
        node = nodes.maintenance(session, node.id, form.get("mode") or "toggle", actor=who.principal.actor)
        return Done(f"node {node.name} is {node.state}")

    return perform(request, back, work, fleet=who.principal)


@router.post("/regions/{ref}/maintenance")
def bulk_maintenance(request: Request, ref: str, posted: Posted) -> Response:
    """Put the selected nodes in maintenance (mode `on`) or make them active (`off`), all or none: one
    refusal (a device, a node not ready) changes nothing and says which node and why."""
    who, form = posted
    back = f"/regions/{ref}"

    def work(session: Session) -> Done:
        region = regions.get(session, ref)
        mode = form.get("mode")
        if mode not in (Maintenance.ON, Maintenance.OFF):
            raise InvalidInput("choose Put in maintenance or Make active")
        picked = form.fields.get("node", [])
        if not picked:
            raise InvalidInput("select the nodes first: tick their boxes in the grid")
        done = [
            nodes.maintenance(session, node_id, mode, region=region.id, actor=who.principal.actor).name
            for node_id in picked
        ]
        verb = "in maintenance" if mode == Maintenance.ON else "active"
        return Done(f"{len(done)} node(s) {verb}: {', '.join(done)}", back)

    return perform(request, back, work, fleet=who.principal)


@router.post("/nodes/{ref}/remove")
def remove_node(request: Request, ref: str, posted: Posted) -> Response:
    who, form = posted

    def work(session: Session) -> Done:
        node = nodes.get(session, ref)
        region_id = node.region_id
        nodes.remove(session, node.id, actor=who.principal.actor, force=form.flag("force"))
        return Done(f"node {node.name} removed", f"/regions/{region_id}")

    return perform(request, f"/nodes/{ref}/remove", work, fleet=who.principal)


@router.post("/nodes/{ref}/replace")
def replace_node(request: Request, ref: str, posted: Posted) -> Response:
    who, form = posted

    def work(session: Session) -> Done:
        old = nodes.get(session, ref)
        new = nodes.replace(
            session, old.id, minion_id=form.required("minion_id", "new minion_id"), actor=who.principal.actor
        )
        session.flush()
        return Done(
            f"storage node {new.name} now waits for minion {new.minion_id}; the old one is removed",
            f"/nodes/{new.id}",
        )

    return perform(request, f"/nodes/{ref}/replace", work, fleet=who.principal)


@router.post("/nodes/{ref}/retry")
def retry_node(request: Request, ref: str, posted: Posted) -> Response:
    """An errored node back to new: its minion joins again (`provision node retry`)."""
    who, form = posted

    def work(session: Session) -> Done:
        node = nodes.get(session, ref)
        node = join_operator.retry(
            session, node.id, accept_pcrs=form.flag("accept_pcrs"), actor=who.principal.actor
        )
        return Done(f"node {node.name} is {node.state}: its minion joins again at its next attempt")

    return perform(request, f"/nodes/{ref}", work, fleet=who.principal)


# ------------------------------------------------------------------------------ devices


def _device_region_page(request: Request, who: Who, ref: str) -> str:
    """The region page of a device the user may see, where its forms are and its refusals show. Looked up
    before the action, so another account's device is the console's 404 page, as on a GET, not a flash."""
    with reading(request, fleet=who.principal) as session:
        return f"/regions/{nodes.get(session, ref).region_id}"


@router.post("/nodes/{ref}/device-config")
def set_device_config(request: Request, ref: str, posted: Posted) -> Response:
    """The device's configuration, at its latest revision (`provision device set-config`): the configs
    of the device's own region only, so of the user's account; Deploy runs it."""
    who, form = posted
    back = _device_region_page(request, who, ref)

    def work(session: Session) -> Done:
        node = nodes.get(session, ref)
        dep = device_deployments.set_config(
            session, node.id, form.required("config", "device configuration"), actor=who.principal.actor
        )
        assert dep.config is not None  # set_config sets it or refuses
        return Done(
            f"device {node.name} set to configuration {dep.config.name} revision {dep.revision}: Deploy "
            "runs it"
        )

    return perform(request, back, work, fleet=who.principal)


@router.post("/nodes/{ref}/deploy")
def deploy_device(request: Request, ref: str, posted: Posted) -> Response:
    """Send the device its configuration's revision (`provision device deploy [--latest]`); the device
    learns it at its next heartbeat and the grid shows what it reports."""
    who, form = posted
    back = _device_region_page(request, who, ref)

    def work(session: Session) -> Done:
        node = nodes.get(session, ref)
        dep = device_deployments.deploy(
            session, node.id, latest=form.flag("latest"), actor=who.principal.actor
        )
        assert dep.config is not None  # deploy refuses a device without one
        return Done(
            f"device {node.name} is deploying configuration {dep.config.name} revision "
            f"{dep.deployed_revision}: it starts at the device's next heartbeat"
        )

    return perform(request, back, work, fleet=who.principal)


# ------------------------------------------------------------------------------ datastores


@router.post("/regions/{ref}/datastores")
def add_datastore(request: Request, ref: str, posted: Posted) -> Response:
    who, form = posted

    def work(session: Session) -> Done:
        region = regions.get(session, ref)
        ds = datastores.add(
            session,
            form.required("name", "datastore name"),
            region=region.id,
            type=form.required("type", "type"),
            address=form.required("address", "address"),
            root=form.required("root", "root path"),
            username=form.optional("username"),
            password=form.optional("password"),
            actor=who.principal.actor,
        )
        return Done(f"datastore {ds.name} added")

    return perform(request, f"/regions/{ref}", work, fleet=who.principal)


@router.post("/datastores/{ref}/remove")
def remove_datastore(request: Request, ref: str, posted: Posted) -> Response:
    who, _ = posted

    def work(session: Session) -> Done:
        ds = datastores.get(session, ref)
        region_id = ds.region_id
        datastores.remove(session, ds.id, actor=who.principal.actor)
        return Done(f"datastore {ds.name} removed", f"/regions/{region_id}")

    return perform(request, f"/datastores/{ref}/remove", work, fleet=who.principal)


# ------------------------------------------------------------------------------ reservations


@router.post("/regions/{ref}/reservations")
def add_reservation(request: Request, ref: str, posted: Posted) -> Response:
    who, form = posted

    def work(session: Session) -> Done:
        region = regions.get(session, ref)
        rsv = reservations.add(
            session,
            form.required("name", "reservation name"),
            region=region.id,
            hostname=form.required("hostname", "hostname"),
            port=form.number("port", "port"),
            protocol=form.get("protocol") or "tcp",
            actor=who.principal.actor,
        )
        return Done(f"reservation {rsv.name} added: assign it to a node")

    return perform(request, f"/regions/{ref}", work, fleet=who.principal)


@router.post("/reservations/{ref}/assign")
def assign_reservation(request: Request, ref: str, posted: Posted) -> Response:
    who, form = posted

    def work(session: Session) -> Done:
        rsv = reservations.get(session, ref)
        node = nodes.get(session, form.required("node", "node"))
        rsv = reservations.assign(session, rsv.id, node=node.id, actor=who.principal.actor)
        return Done(f"reservation {rsv.name} assigned to node {node.name}")

    return perform(request, local_path(form.get("back"), "/"), work, fleet=who.principal)


@router.post("/reservations/{ref}/unassign")
def unassign_reservation(request: Request, ref: str, posted: Posted) -> Response:
    who, form = posted

    def work(session: Session) -> Done:
        rsv = reservations.get(session, ref)
        rsv = reservations.unassign(session, rsv.id, actor=who.principal.actor)
        return Done(f"reservation {rsv.name} unassigned")

    return perform(request, local_path(form.get("back"), "/"), work, fleet=who.principal)


@router.post("/reservations/{ref}/remove")
def remove_reservation(request: Request, ref: str, posted: Posted) -> Response:
    who, _ = posted

    def work(session: Session) -> Done:
        rsv = reservations.get(session, ref)
        region_id = rsv.region_id
        reservations.remove(session, rsv.id, actor=who.principal.actor)
        return Done(f"reservation {rsv.name} removed", f"/regions/{region_id}")

    return perform(request, f"/reservations/{ref}/remove", work, fleet=who.principal)
