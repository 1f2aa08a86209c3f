"""`provision datastore …`: add, list, show, remove."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from contracts.regional import DatastoreType
from provisioner.cli import render
from provisioner.cli.common import (
    Json,
    RegionOpt,
    Yes,
    group,
    output_options,
    read_secret_file,
    remove_one,
    show_one,
)
from provisioner.cli.settings import connect

app = group("Datastores: NFS or SMB shares of a region; jobs get paths below the root, never above.")
COLUMNS = [
    ("id", "ID"),
    ("name", "NAME"),
    ("region", "REGION"),
    ("type", "TYPE"),
    ("address", "ADDRESS"),
    ("root", "ROOT"),
    ("username", "USER"),
    ("state", "STATE"),
]


@app.command("add")
def add(
    name: Annotated[str, typer.Argument(help="DNS label, unique in its region.")],
    region: Annotated[str, typer.Option("--region", "-r", help="Region of the datastore.")],
    type_: Annotated[DatastoreType, typer.Option("--type", help="nfs or smb.")],
    address: Annotated[str, typer.Option("--address", help="Server host name or IP address.")],
    root: Annotated[str, typer.Option("--root", help="Absolute path on the server (SMB: /share[/dir]).")],
    username: Annotated[
        str | None, typer.Option("--username", help="SMB user (required for smb, refused for nfs).")
    ] = None,
    password_file: Annotated[
        Path | None,
        typer.Option(
            "--password-file",
            help="File (mode 600) holding the SMB password (never on the command line); - reads stdin.",
        ),
    ] = None,
    json_out: Json = False,
) -> None:
    """Add a datastore; prints its id. The password is stored encrypted and never shown again."""
    body = {
        "name": name,
        "region": region,
        "type": type_.value,
        "address": address,
        "root": root,
        "username": username,
        "password": read_secret_file(
            password_file, "a text file holding the password", called="password file"
        )
        if password_file
        else None,
    }
    render.created(connect().post("/v1/datastores", body), as_json=json_out)


@app.command("list")
@output_options
def list_(
    region: Annotated[
        str | None, typer.Option("--region", "-r", help="Only this region's datastores.")
    ] = None,
    json_out: Json = False,
) -> None:
    """List datastores."""
    rows = render.by_region_then_name(connect().get("/v1/datastores", region=region)["items"])
    render.table(
        rows,
        COLUMNS,
        as_json=json_out,
        empty="no datastore yet: `provision datastore add NAME --region R --type nfs --address H --root /P`",
    )


@app.command("show")
@output_options
def show(name: str, region: RegionOpt = None, json_out: Json = False) -> None:
    """Show one datastore (the password is never shown; `has_password` says whether one is stored)."""
    show_one(f"/v1/datastores/{name}", as_json=json_out, region=region)


@app.command("remove")
def remove(name: str, region: RegionOpt = None, yes: Yes = False, json_out: Json = False) -> None:
    """Remove a datastore (kept as `removed` in the audit trail)."""
    remove_one(
        f"remove datastore '{name}'?", f"/v1/datastores/{name}", yes=yes, as_json=json_out, region=region
    )
