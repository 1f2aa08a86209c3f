"""`provision project …`: the projects of this token's account — create, list, show, remove
(docs/accounts.md). Jobs belong to a project; `--project` defaults to the account's default project."""

from __future__ import annotations

from typing import Annotated

import typer

from provisioner.cli import render
from provisioner.cli.common import Json, Yes, group, output_options, remove_one, show_one
from provisioner.cli.settings import connect

app = group("Projects: where jobs belong, inside your account.")
COLUMNS = [
    ("id", "ID"),
    ("name", "NAME"),
    ("default", "DEFAULT"),
    ("description", "DESCRIPTION"),
    ("created_at", "CREATED"),
]
WIDE = [("account", "ACCOUNT")]
Name = Annotated[str, typer.Argument(help="Project name or id.")]


@app.command("create")
def create(
    name: Annotated[str, typer.Argument(help="DNS label, unique among your account's projects.")],
    description: Annotated[
        str | None, typer.Option("--description", "-d", help="One line: what the project is for.")
    ] = None,
    json_out: Json = False,
) -> None:
    """Create a project in this token's account; prints its id."""
    body = {"name": name, "description": description}
    render.created(connect().post("/v1/projects", body), as_json=json_out)


@app.command("list")
@output_options
def list_(json_out: Json = False) -> None:
    """List your account's projects."""
    render.table(
        connect().get("/v1/projects")["items"],
        COLUMNS,
        wide=WIDE,
        as_json=json_out,
        empty="no project yet: `provision project create NAME`",
    )


@app.command("show")
@output_options
def show(name: Name, json_out: Json = False) -> None:
    """Show one project (by name or id)."""
    show_one(f"/v1/projects/{name}", as_json=json_out)


@app.command("remove")
def remove(name: Name, yes: Yes = False, json_out: Json = False) -> None:
    """Remove a project; refused for the default project and while the project has jobs."""
    remove_one(f"remove project '{name}'?", f"/v1/projects/{name}", yes=yes, as_json=json_out)
