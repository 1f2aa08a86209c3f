"""`provision`: the operator's command line. Each command group is a module of provisioner/cli/;
adding one is ONE `add_typer` line below. Shared options and output live in common.py and render.py."""

from __future__ import annotations

import typer

from provisioner.cli import (
    backup,
    datastores,
    enrollment,
    gcp,
    images,
    lab,
    nodes,
    providers,
    regions,
    reservations,
    serve,
    status,
    tokens,
)

app = typer.Typer(
    help="rigbase control plane: providers, regions and nodes of your GPU fleet.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)

app.command("serve")(serve.serve)
app.command("backup")(backup.backup)
app.command("restore")(backup.restore)
app.command("status")(status.status)
app.command("doctor")(status.doctor)
app.add_typer(providers.app, name="provider")
app.add_typer(regions.app, name="region")
regions.app.command("quota")(gcp.quota)
app.add_typer(nodes.app, name="node")
app.add_typer(lab.app, name="lab")
app.add_typer(reservations.app, name="reservation")
app.add_typer(datastores.app, name="datastore")
app.add_typer(
    enrollment.tpm_ca, name="tpm-ca"
)  # also adds region join-token|bundle|update, node pending|retry
app.add_typer(images.app, name="image")
app.add_typer(tokens.app, name="token")
