"""`provision serve`: migrate the store, make sure an admin token exists, run the API.

The command loads the settings once (provisioner/settings.py, --database on top) and hands them to
`run_control_plane`, which tests also call (tests/fixtures/serve_app.py) to run the same server with
injected fakes."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from contracts.ports import CONTROL_PLANE_PORT
from provisioner.cli.common import CliError

if TYPE_CHECKING:  # pragma: no cover
    import socket

    from provisioner.adapters.tls import ServerTls
    from provisioner.providers.base import ProviderDriver
    from provisioner.settings import Settings


# The address a plain `--insecure-http` server binds to unless --host says otherwise: tokens must not
# cross a network unencrypted, so plain HTTP stays on this host by default.
INSECURE_DEFAULT_HOST = "127.0.0.1"
TLS_DEFAULT_HOST = "0.0.0.0"
# How long a stopping server waits for its connections before it drops them. Without a bound uvicorn waits
# for every connection to close, and closing a TLS connection waits for the peer's close_notify for up to
# 30 s (asyncio's ssl_shutdown_timeout): one idle client that does not answer (a suspended laptop, a
# client that never closes) held every stop of `provision serve` for 30 s. A request's unit of work takes
# milliseconds; a minion whose beat a stop cuts off sends the next one (docs/production.md, "Stopping").
SHUTDOWN_GRACE_S = 5


def _is_address(name: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _client_url(host: str, port: int, tls: ServerTls | None) -> str:
    """The URL the `provision` commands of this host use: loopback for a wildcard bind. An operator's
    certificate that does not name that address is reached at its first DNS name instead (it names this
    host, or nothing here could verify it)."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else ("::1" if host == "::" else host)
    if tls is not None and tls.names and shown not in tls.names:
        dns = [n for n in tls.names if not n.startswith("*") and not _is_address(n)]
        shown = dns[0] if dns else shown
    if ":" in shown:
        shown = f"[{shown}]"
    return f"{'https' if tls else 'http'}://{shown}:{port}"


def _answers(url: str, ca: str | None) -> bool:
    """Whether a control plane answers at `url` now (a second `serve` on the same home must not take
    the client config away from a server that is still running)."""
    import httpx

    from provisioner.client.http import client_context

    try:
        verify = client_context(Path(ca) if ca else None)
        return httpx.get(f"{url.rstrip('/')}/healthz", timeout=2.0, verify=verify).status_code == 200
    except (httpx.HTTPError, ValueError, OSError):
        return False


def _claim(host: str, port: int) -> socket.socket:
    """The listening socket, or one line saying what holds the port (ports.holder)."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family)
    except OSError as exc:
        from provisioner.cli.ports import holder

        held = holder(port)
        why = f"held by {held}" if held else exc.strerror
        raise CliError(
            f"cannot listen on {host}:{port} ({why}): stop it, or pick another port with --port"
        ) from None


def run_control_plane(  # noqa: C901, PLR0915
    settings: Settings,
    host: str | None,
    port: int,
    fds: Sequence[int] = (),
    *,
    providers: Mapping[str, ProviderDriver] | None = None,
    workers: int = 1,
) -> None:
    """Build the app from `settings`, bootstrap the admin token and client config, serve until stopped.
    `providers`: fakes a test injects (create_app). `host` None: all interfaces with TLS, loopback
    with --insecure-http. `workers` > 1: that many processes (provisioner/api/asgi.py), the reconcilers
    in one of them."""
    import uvicorn  # heavy imports only for this command, so `provision --help` stays instant

    from contracts.errors import RigbaseError
    from provisioner.adapters.tls import rotating_tickets, server_tls
    from provisioner.api.app import create_app
    from provisioner.api.http_protocol import HTTP_PROTOCOL
    from provisioner.api.tuning import SERVE_LOOP, keep_alive_s, tune_process
    from provisioner.client import read_client_config, write_client_config
    from provisioner.services.accounts import tokens
    from provisioner.store.engine import make_sessionmaker, session_scope

    if host is None:
        host = INSECURE_DEFAULT_HOST if settings.insecure_http else TLS_DEFAULT_HOST
    if settings.peer_address is not None and settings.insecure_http:
        raise CliError("--peer-address needs TLS: hosts relay tunnels only over TLS; drop --insecure-http")
    if settings.peer_address is not None and workers > 1 and settings.peer_port:
        raise CliError(f"--peer-port {settings.peer_port} cannot serve --workers {workers}: leave it out "
                       "(each process takes a free port and says which in the store)")  # fmt: skip
    listening = _claim(host, port)  # before anything is written: a busy port changes nothing on disk
    settings.ensure_home()
    client_config = settings.client_config
    try:
        tls = server_tls(settings, host)
        app = create_app(settings, reconcilers=settings.reconcilers, providers=providers)
        with session_scope(make_sessionmaker(app.state.engine)) as session:
            token = tokens.bootstrap_admin(session)
            saved = read_client_config(client_config)
            if token is None and saved.get("token") and tokens.is_valid(session, saved["token"]):
                token = saved["token"]  # keep the operator's token; refresh the URL (port may have changed)
    except RigbaseError as exc:
        raise CliError(exc.message) from exc
    client_url = _client_url(host, port, tls)
    ca = str(tls.ca) if tls and tls.ca else None
    if tls is None:
        print(
            f"WARNING: --insecure-http: plain HTTP on {host}:{port}; operator tokens, join tokens and "
            "node credentials travel unencrypted. Use it on loopback or in a throwaway lab only.",
            file=sys.stderr,
        )
    elif tls.issued:
        print(f"TLS: new server certificate for {', '.join(tls.names)} (CA {tls.ca})", file=sys.stderr)
    other = saved.get("url")
    if other and other != client_url and _answers(other, saved.get("ca")):
        print(
            f"note: {client_config} points at the control plane running at {other}, so it is kept: "
            f"to reach this one, set RIGBASE_URL={client_url}",
            file=sys.stderr,
        )
    elif token:
        write_client_config(client_url, token, client_config, ca=ca)
        what = "URL, CA and admin token" if ca else "URL and admin token"
        print(f"client config: {client_config} ({what}, mode 0600)", file=sys.stderr)
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
    ssl_files = (
        {
            "ssl_certfile": str(tls.cert),
            "ssl_keyfile": str(tls.key),
            "ssl_context_factory": rotating_tickets,  # a module's function: workers unpickle it
        }
        if tls
        else {}
    )
    options = {
        "log_level": "warning",
        # uvloop and httptools (uvicorn's own "standard" stack) rather than asyncio and h11: a held TLS
        # connection costs 38 KiB, not 65 (bench fleet_heartbeats), and the HTTP parser is C; its
        # protocol lets go of a finished request (api/http_protocol.py)
        "loop": SERVE_LOOP,
        "http": HTTP_PROTOCOL,
        "timeout_graceful_shutdown": SHUTDOWN_GRACE_S,
        # a minion keeps one connection from beat to beat (minion/join/client.py beat_idle_s)
        "timeout_keep_alive": keep_alive_s(settings.heartbeat_s),
        # uvicorn believes X-Forwarded-For from 127.0.0.1 unless told otherwise: only named proxies
        "proxy_headers": bool(settings.trusted_proxies),
        "forwarded_allow_ips": ",".join(settings.trusted_proxies) or None,
        **ssl_files,
    }
    if workers > 1:
        if fds or providers:
            raise CliError("--workers cannot be combined with --fd (the lab) or injected providers")
        listening.close()  # uvicorn's workers bind it themselves
        # the workers' sockets to each other (api/tunnel_relay.py): short, private, gone when serve stops
        relay_dir = Path(tempfile.mkdtemp(prefix="rigbase-relay-"))
        settings = settings.model_copy(update={"tunnel_relay_dir": relay_dir})
        # every worker loads the same settings: the ones given as flags go into the environment
        os.environ.update(settings.as_environment())
        app.state.engine.dispose()  # the workers open their own connections
        try:
            uvicorn.run(
                "provisioner.api.asgi:app_from_environment",
                factory=True,
                workers=workers,
                host=host,
                port=port,
                **options,  # type: ignore[arg-type]
            )
        finally:
            shutil.rmtree(relay_dir, ignore_errors=True)
        return
    tune_process()
    if not fds:
        listening.close()  # it proved the port free before anything was written; uvicorn binds its own
        uvicorn.run(app, host=host, port=port, **options)  # type: ignore[arg-type]
        return
    # A listening socket keeps the network namespace it was created in, so one process can answer on
    # the host's loopback and, through an inherited socket, on a LAN that exists only in a namespace.
    import socket

    sockets = [listening, *(socket.socket(fileno=fd) for fd in fds)]
    uvicorn.Server(uvicorn.Config(app, **options)).run(sockets=sockets)  # type: ignore[arg-type]


def serve(
    host: Annotated[
        str | None,
        typer.Option(
            "--host", help="Address to listen on (default: all interfaces; 127.0.0.1 with --insecure-http)."
        ),
    ] = None,
    port: Annotated[int, typer.Option("--port", help="TCP port.", min=1, max=65535)] = CONTROL_PLANE_PORT,
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
    advertise: Annotated[
        list[str] | None,
        typer.Option(
            "--advertise",
            help="A DNS name or IP address nodes and operators reach this server at, for its certificate "
            "(repeat it; default: this host's name and addresses; loopback is always included).",
        ),
    ] = None,
    tls_cert: Annotated[
        Path | None,
        typer.Option("--tls-cert", dir_okay=False, help="Your own server certificate (PEM, chain)."),
    ] = None,
    tls_key: Annotated[Path | None, typer.Option("--tls-key", dir_okay=False, help="Its key (PEM).")] = None,
    tls_ca: Annotated[
        Path | None,
        typer.Option(
            "--tls-ca",
            dir_okay=False,
            help="The private CA --tls-cert chains to: the CLI and the nodes then trust only it.",
        ),
    ] = None,
    insecure_http: Annotated[
        bool,
        typer.Option(
            "--insecure-http",
            help="Serve plain HTTP (binds 127.0.0.1 unless --host): tokens travel unencrypted.",
        ),
    ] = False,
    peer_address: Annotated[
        str | None,
        typer.Option(
            "--peer-address",
            help="With several control-plane hosts: the address the others reach this one at, so a job's "
            "URL answers through whichever host holds its node's tunnel (docs/control-plane.md).",
        ),
    ] = None,
    peer_port: Annotated[
        int | None,
        typer.Option(
            "--peer-port", min=0, max=65535, help="The port for --peer-address (default 0: a free one)."
        ),
    ] = None,
    workers: Annotated[
        int,
        typer.Option(
            "--workers",
            min=1,
            max=64,
            help="API processes (PostgreSQL recommended); the reconcilers run in exactly one of them.",
        ),
    ] = 1,
) -> None:
    """Run the control plane over TLS. The first start creates the control-plane CA, an admin token and
    the client config."""
    from contracts.errors import RigbaseError
    from provisioner.settings import Settings

    try:
        settings = Settings.load(
            database_url=database,
            advertise=tuple(advertise) if advertise else None,
            tls_cert=tls_cert,
            tls_key=tls_key,
            tls_ca=tls_ca,
            insecure_http=True if insecure_http else None,
            peer_address=peer_address,
            peer_port=peer_port,
        )
    except RigbaseError as exc:
        raise CliError(exc.message) from exc
    run_control_plane(settings, host, port, fds or (), workers=workers)
