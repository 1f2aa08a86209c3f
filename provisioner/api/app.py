"""The control plane's ASGI app. `create_app()` migrates the store (refusing a newer schema or an
unreachable database with one line), then wires routers.

Adding a router is one line in OPERATOR_ROUTERS (operator bearer token required on every route) or
in OPEN_ROUTERS (routes that authenticate differently, e.g. minions with node credentials)."""

from __future__ import annotations

from fastapi import Depends, FastAPI
from sqlalchemy import Engine

from provisioner.api import errors
from provisioner.api.deps import require_operator
from provisioner.api.routes import nodes, providers, regions
from provisioner.config import database_url as default_database_url
from provisioner.store.engine import make_engine, make_sessionmaker
from provisioner.store.migrate import upgrade

OPERATOR_ROUTERS = [
    providers.router,
    regions.router,
    nodes.router,
]
OPEN_ROUTERS: list = []  # e.g. join.router (node-credential auth of its own)


def create_app(database_url: str | None = None, *, engine: Engine | None = None, migrate: bool = True) -> FastAPI:
    url = database_url or default_database_url()
    engine = engine or make_engine(url)
    if migrate:
        upgrade(url, engine)
    app = FastAPI(
        title="rigbase control plane",
        version="1",
        description="Providers, regions and nodes of a rigbase fleet. Every /v1/ route needs "
                    "`Authorization: Bearer <token>`; /openapi.json and /healthz do not.",
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
