"""`provision`: the operator's command line. Each command group is a module of provisioner/cli/;
adding one is ONE `add_typer` line below. Shared options and output live in common.py and render.py."""

from __future__ import annotations

from typing import Annotated

import typer

from provisioner.cli import (
    accounts,
    adoption,  # noqa: F401 - adds node accept|reject|unreject|rejected
    backup,
    billing,
    datastores,
    device_configs,
    devices,
    enrollment,
    gcp,
    images,
    jobs,
    lab,
    nodes,
    projects,
    providers,
    regions,
    reservations,
    serve,
    status,
    tokens,
)
from provisioner.cli.common import HELP_OPTIONS, OneLineErrors

app = typer.Typer(
    help="rigbase control plane: providers, regions and nodes of your GPU fleet.",
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    cls=OneLineErrors,
    context_settings=HELP_OPTIONS,
)


def _server_version() -> str:
    """The version the control plane reports (GET /v1/status), or why there is none: --version must
    answer even when no server is configured or up."""
    from provisioner.cli.settings import connect

    try:
        return str(connect().http.get("/v1/status", timeout=3).raise_for_status().json()["version"])
    except Exception as exc:  # any failure is an answer here, not an error: the client's version stands
        return f"unreachable ({type(exc).__name__})"


def _version(value: bool) -> None:
    if value:
        print(f"client: {status.client_version()}")
        print(f"server: {_server_version()}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", is_eager=True, callback=_version, help="Print the client's and the server's version."
        ),
    ] = False,
) -> None:
    """rigbase control plane: providers, regions and nodes of your GPU fleet."""


app.command("serve")(serve.serve)
app.command("backup")(backup.backup)
app.command("restore")(backup.restore)
app.command("status")(status.status)
app.command("doctor")(status.doctor)
app.add_typer(providers.app, name="provider")
app.add_typer(regions.app, name="region")
regions.app.command("quota")(gcp.quota)
app.add_typer(nodes.app, name="node")
app.add_typer(devices.app, name="device")
app.add_typer(device_configs.app, name="device-config")
app.add_typer(lab.app, name="lab")
app.add_typer(reservations.app, name="reservation")
app.add_typer(datastores.app, name="datastore")
app.add_typer(
    enrollment.tpm_ca, name="tpm-ca"
)  # also adds region join-token|bundle|update, node pending|retry
app.add_typer(images.app, name="image")
app.add_typer(tokens.app, name="token")
app.add_typer(accounts.app, name="account")
app.add_typer(projects.app, name="project")
app.add_typer(jobs.app, name="job")
app.add_typer(billing.app, name="billing")
app.add_typer(billing.price_app, name="price")
