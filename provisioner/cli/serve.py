"""`provision serve`: migrate the store, make sure an admin token exists, run the API.

The command loads the settings once (provisioner/settings.py, --database on top) and hands them to
`run_control_plane`, which tests also call (tests/fixtures/serve_app.py) to run the same server with
injected fakes."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated

import typer

from provisioner.cli.common import CliError
from provisioner.settings import DEFAULT_PORT, Settings

if TYPE_CHECKING:  # pragma: no cover
    from provisioner.adapters.ansible import Finalizer
    from provisioner.providers.base import ProviderDriver


def _client_url(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else ("[::1]" if host == "::" else host)
    return f"http://{shown}:{port}"


def _answers(url: str) -> bool:
    """Whether a control plane answers at `url` now (a second `serve` on the same home must not take
    the client config away from a server that is still running)."""
    import httpx

    try:
        return httpx.get(f"{url.rstrip('/')}/healthz", timeout=2.0).status_code == 200
    except (httpx.HTTPError, ValueError):
        return False


def _tune_gc() -> None:
    """A page of 500 nodes allocates tens of thousands of short-lived objects; with CPython's default
    thresholds a full collection of everything the app imported lands inside some requests and sets
    the p99 (bench/bench_api.py). Freezing the start-up heap and collecting young objects less often
    keeps the pauses short; memory stays bounded because full collections still run."""
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 50)


def run_control_plane(
    settings: Settings,
    host: str,
    port: int,
    fds: Sequence[int] = (),
    *,
    finalizer: Finalizer | None = None,
    providers: Mapping[str, ProviderDriver] | None = None,
) -> None:
    """Build the app from `settings`, bootstrap the admin token and client config, serve until stopped.
    `finalizer` / `providers`: fakes a test injects (create_app)."""
    import uvicorn  # heavy imports only for this command, so `provision --help` stays instant

    from contracts.errors import RigbaseError
    from provisioner.api.app import create_app
    from provisioner.client import read_client_config, write_client_config
    from provisioner.services import tokens
    from provisioner.store.engine import make_sessionmaker, session_scope

    settings.ensure_home()
    client_config = settings.client_config
    try:
        app = create_app(settings, reconcilers=settings.reconcilers, finalizer=finalizer, providers=providers)
        with session_scope(make_sessionmaker(app.state.engine)) as session:
            token = tokens.bootstrap_admin(session)
            saved = read_client_config(client_config)
            if token is None and saved.get("token") and tokens.is_valid(session, saved["token"]):
                token = saved["token"]  # keep the operator's token; refresh the URL (port may have changed)
    except RigbaseError as exc:
        raise CliError(exc.message) from exc
    client_url = _client_url(host, port)
    other = saved.get("url")
    if other and other != client_url and _answers(other):
        print(
            f"note: {client_config} points at the control plane running at {other}, so it is kept: "
            f"to reach this one, set RIGBASE_URL={client_url}",
            file=sys.stderr,
        )
    elif token:
        write_client_config(client_url, token, client_config)
        print(f"client config: {client_config} (URL and admin token, mode 0600)", file=sys.stderr)
    else:
        print(
            f"note: an admin token exists but {client_config} does not hold it: "
            "set RIGBASE_URL and RIGBASE_TOKEN",
            file=sys.stderr,
        )
    print(
        f"rigbase control plane on {client_url} (OpenAPI: {client_url}/openapi.json)",
        file=sys.stderr,
        flush=True,
    )
    _tune_gc()
    if not fds:
        uvicorn.run(app, host=host, port=port, log_level="warning")
        return
    # A listening socket keeps the network namespace it was created in, so one process can answer on
    # the host's loopback and, through an inherited socket, on a LAN that exists only in a namespace.
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sockets = [socket.create_server((host, port), family=family), *(socket.socket(fileno=fd) for fd in fds)]
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=sockets)


def serve(
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port.", min=1, max=65535)] = DEFAULT_PORT,
    database: Annotated[
        str | None,
        typer.Option(
            "--database", help="Database URL (default: RIGBASE_DATABASE_URL or SQLite under RIGBASE_HOME)."
        ),
    ] = None,
    fds: Annotated[
        list[int] | None,
        typer.Option(
            "--fd",
            help="Also serve on this inherited listening socket (socket activation; `provision lab up` "
            "passes one bound inside the lab's LAN namespace).",
        ),
    ] = None,
) -> None:
    """Run the control plane. The first start creates an admin token and writes the client config."""
    from contracts.errors import RigbaseError

    try:
        settings = Settings.load(database_url=database)
    except RigbaseError as exc:
        raise CliError(exc.message) from exc
    run_control_plane(settings, host, port, fds or ())
