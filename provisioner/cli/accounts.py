"""`provision account …`: accounts — create, list, show (docs/accounts.md). Only the root account's admins
create accounts and see them all; any other token sees its own account."""

from __future__ import annotations

from typing import Annotated

import typer

from provisioner.cli import render
from provisioner.cli.common import Json, group, output_options, show_one
from provisioner.cli.settings import connect

app = group("Accounts: who owns tokens, regions, projects and jobs.")
COLUMNS = [
    ("id", "ID"),
    ("name", "NAME"),
    ("root", "ROOT"),
    ("default_project", "DEFAULT PROJECT"),
    ("created_at", "CREATED"),
]


@app.command("create")
def create(
    name: Annotated[str, typer.Argument(help="DNS label: lowercase letters, digits and '-'.")],
    json_out: Json = False,
) -> None:
    """Create an account with its default project; prints its id. Give it a first admin token with
    `provision token create NAME --account ACCOUNT --role admin`."""
    render.created(connect().post("/v1/accounts", {"name": name}), as_json=json_out)


@app.command("list")
@output_options
def list_(json_out: Json = False) -> None:
    """List the accounts this token may see (all of them for the root account's admins)."""
    render.table(connect().get("/v1/accounts")["items"], COLUMNS, as_json=json_out)


@app.command("show")
@output_options
def show(name: Annotated[str, typer.Argument(help="Account name or id.")], json_out: Json = False) -> None:
    """Show one account (by name or id)."""
    show_one(f"/v1/accounts/{name}", as_json=json_out)
