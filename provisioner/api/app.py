"""The control plane's ASGI app. `create_app()` migrates the store (refusing a newer schema or an
unreachable database with one line), then wires routers.

Adding a router is one line in OPERATOR_ROUTERS (operator bearer token required on every route) or
in OPEN_ROUTERS (routes that authenticate differently, e.g. minions with node credentials)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI
from sqlalchemy import Engine

from provisioner.api import errors
from provisioner.api.deps import require_operator
from provisioner.api.routes import enrollment, join, nodes, providers, regions
from provisioner.api.routes import datastores, reservations
from provisioner.api.routes import gcp
from provisioner.api.routes import images
from provisioner.config import database_url as default_database_url
from provisioner.store.engine import make_engine, make_sessionmaker
from provisioner.store.migrate import upgrade

OPERATOR_ROUTERS = [
    providers.router,
    regions.router,
    nodes.router,
    reservations.router,
    datastores.router,
    gcp.router,
    enrollment.router,
    images.router,
]
OPEN_ROUTERS: list = [join.router]  # join token / node credential auth of their own


@asynccontextmanager
async def _reconciler_lifespan(app: FastAPI) -> AsyncIterator[None]:
    from provisioner.reconcilers.loop import ReconcilerLoop

    loop = ReconcilerLoop(app.state.sessions)
    loop.start()
    try:
        yield
    finally:
        loop.stop()


def create_app(database_url: str | None = None, *, engine: Engine | None = None, migrate: bool = True,
               reconcilers: bool = False) -> FastAPI:
    """`reconcilers=True` (what `provision serve` passes) runs the reconciler loop for the app's lifetime;
    unit tests leave it off and step the world with `ReconcilerLoop(sessions).run_once()`."""
    url = database_url or default_database_url()
    engine = engine or make_engine(url)
    if migrate:
        upgrade(url, engine)
    app = FastAPI(
        title="rigbase control plane",
        version="1",
        description="Providers, regions and nodes of a rigbase fleet. Every /v1/ route needs "
                    "`Authorization: Bearer <token>`; /openapi.json and /healthz do not.",
        lifespan=_reconciler_lifespan if reconcilers else None,
    )
    app.state.engine = engine
    app.state.sessions = make_sessionmaker(engine)
    errors.install(app)

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    for router in OPERATOR_ROUTERS:
        app.include_router(router, dependencies=[Depends(require_operator)])
    for router in OPEN_ROUTERS:
        app.include_router(router)
    return app
