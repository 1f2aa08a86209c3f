"""The control plane's ASGI app. `create_app(settings)` migrates the store (refusing a newer schema or an
unreachable database with one line), then wires routers. The settings are the ones `provision serve`
loaded once (provisioner/settings.py); the app keeps them on app.state and gives its services and
reconcilers what they need through the runtime it attaches to its sessions (services/common/runtime.py).

Adding a router is one line in FLEET_ROUTERS (regions and what is in them: the unit of work sees only the
caller's account's regions, and a change needs an admin), OPERATOR_ROUTERS (account-scoped by their
services) or OPEN_ROUTERS (routes that authenticate differently, e.g. minions with node credentials).
The OpenAPI document at /openapi.json is the API's description (there are no /docs or /redoc pages):
each route's security scheme comes from the credential it reads (provisioner/api/deps.py), and its
error responses from the tables in provisioner/api/errors.py."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI
from sqlalchemy import Engine

from provisioner.api import console, errors, fleet_metrics, job_proxy, links
from provisioner.api.deps import FleetScope, require_operator
from provisioner.api.job_proxy import Proxy
from provisioner.api.limits import RequestLimits
from provisioner.api.relay_peers import peer_link
from provisioner.api.routes import (
    accounts,
    billing,
    data_objects,
    datastores,
    devices,
    enrollment,
    finalize,
    gcp,
    images,
    jobs,
    join,
    nodes,
    project_keys,
    projects,
    providers,
    regions,
    reservations,
    status,
    tokens,
    tunnel,
)
from provisioner.api.tunnel_hub import TunnelHub
from provisioner.api.tunnel_relay import TunnelRelay
from provisioner.providers.base import ProviderDriver
from provisioner.reconcilers.loop import ReconcilerLoop
from provisioner.services.common.heartbeat_timing import HeartbeatTiming
from provisioner.services.common.runtime import Runtime, attach
from provisioner.settings import Settings
from provisioner.store.engine import make_engine, make_sessionmaker
from provisioner.store.migrate import upgrade

# the fleet: regions and what is in them, scoped to the caller's account (api/deps.py fleet_principal)
FLEET_ROUTERS = [
    providers.router,
    regions.router,
    nodes.router,
    reservations.router,
    datastores.router,
    gcp.router,
    enrollment.router,
    images.router,
    devices.router,
    status.router,
]
# account-scoped by their services (projects, jobs, tokens, billing)
OPERATOR_ROUTERS = [
    tokens.router,
    accounts.router,
    project_keys.router,  # before projects: its /{ref:anypath} would take …/keys
    projects.router,
    jobs.router,
    tunnel.router,
    data_objects.router,
    billing.router,
]
# join token / node credential auth of their own
OPEN_ROUTERS: list = [
    join.router,
    finalize.router,
    jobs.node_router,
    data_objects.node_router,
    devices.node_router,
    tunnel.node_router,
    tunnel.connect_router,  # a WebSocket: its operator token is checked by the route itself
    fleet_metrics.router,  # a scrape token of its own (api/deps.py Scraper)
]


class ControlPlaneApp(FastAPI):
    def openapi(self) -> dict[str, Any]:
        """FastAPI's document, with the error responses the server really sends (errors.describe_errors)."""
        if self.openapi_schema is None:
            self.openapi_schema = links.add_links(errors.describe_errors(super().openapi()))
        return self.openapi_schema


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """The relay to this process's siblings under `serve --workers N`, and the reconcilers when asked."""
    async with AsyncExitStack() as stack:
        settings = app.state.settings
        peers = peer_link(settings, app.state.runtime.sealer, app.state.sessions)
        if settings.tunnel_relay_dir is not None or peers is not None:
            relay = TunnelRelay(settings.tunnel_relay_dir, app.state.job_proxy.hub, peers)
            await relay.start()
            stack.push_async_callback(relay.stop)
        if app.state.run_reconcilers:
            loop = ReconcilerLoop(app.state.sessions)
            app.state.reconciler_loop = loop
            loop.start()
            stack.callback(loop.stop)
        yield


def create_app(
    settings: Settings | str | None = None,
    *,
    engine: Engine | None = None,
    migrate: bool = True,
    reconcilers: bool = False,
    heartbeat_timing: HeartbeatTiming | None = None,
    providers: Mapping[str, ProviderDriver] | None = None,
) -> FastAPI:
    """`reconcilers=True` (what `provision serve` passes) runs the reconciler loop for the app's lifetime;
    unit tests leave it off and step the world with `ReconcilerLoop(sessions).run_once()`.

    `settings`: what `provision serve` loaded; a database URL alone (tests) means the environment's
    settings with that database. `providers` replace the real provider drivers (tests inject fakes:
    GCP clients pointed at local servers)."""
    if not isinstance(settings, Settings):
        settings = Settings.load(database_url=settings)
    url = settings.database
    engine = engine or make_engine(url)
    if migrate:
        upgrade(url, engine)
    app = ControlPlaneApp(
        title="rigbase control plane",
        version="1",
        description="Providers, regions and nodes of a rigbase fleet. Every /v1/ route needs "
        "`Authorization: Bearer <token>` (an operator token, a node credential or a join token: see "
        "each route's security) except `POST /v1/join`, whose join token is in the body; /openapi.json "
        "and /healthz are the only public routes. Every error answers `{code, message}`.",
        lifespan=_lifespan,
        docs_url=None,
        redoc_url=None,
    )
    runtime = Runtime.from_settings(settings, providers=providers)
    if heartbeat_timing is not None:
        runtime = dataclasses.replace(runtime, heartbeat=heartbeat_timing)
    app.state.settings = settings
    app.state.run_reconcilers = reconcilers
    app.state.runtime = runtime
    app.state.engine = engine
    app.state.sessions = attach(make_sessionmaker(engine), runtime)
    app.state.job_proxy = Proxy(
        TunnelHub(settings.tunnel_streams_per_job, settings.tunnel_streams_per_source)
    )
    errors.install(app)
    # before FastAPI reads a body: 429 for abusive sources, 401 without a token, 413 past the route's cap
    app.add_middleware(RequestLimits, settings=settings)
    # outermost: times every request and counts every refusal, the limits' own among them
    app.state.metrics = fleet_metrics.Metrics(lambda: getattr(app.state, "reconciler_loop", None))
    app.add_middleware(fleet_metrics.RequestTiming, metrics=app.state.metrics)

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str | int | bool]:
        """Liveness, and which process answered: its pid and whether it runs the reconcilers (one process
        of all the workers on a store does; provisioner/reconcilers/leader.py)."""
        loop = getattr(app.state, "reconciler_loop", None)
        leading = bool(loop and loop.leadership and loop.leadership.leading.is_set())
        return {"status": "ok", "pid": os.getpid(), "reconciler_leader": leading}

    # the minion's routes first: the router tries routes in order, and a fleet's heartbeats are most of
    # the traffic (behind the hundred operator routes, matching a beat's path took a twentieth of its CPU).
    # No operator route matches a method and path of theirs, so the order changes no answer.
    for router in OPEN_ROUTERS:
        app.include_router(router)
    for router in OPERATOR_ROUTERS:
        app.include_router(router, dependencies=[Depends(require_operator)], responses=errors.OPERATOR_ERRORS)
    for router in FLEET_ROUTERS:
        app.include_router(
            router, dependencies=[Depends(require_operator), FleetScope], responses=errors.OPERATOR_ERRORS
        )
    app.include_router(job_proxy.router)  # /j/JOB_ID/: notebooks' and endpoints' URLs
    console.mount(app)  # the operator's console at / (after the API: its 404 page never shadows /v1)
    return app
