"""`provision project …`: the projects of this token's account — create, list, show, remove, share,
unshare (docs/accounts.md). Jobs belong to a project; `--project` defaults to the account's default
project, and names a project shared with this account as OWNER/PROJECT."""

from __future__ import annotations

from typing import Annotated

import typer

from provisioner.cli import render
from provisioner.cli.common import Json, Yes, group, output_options, remove_one, show_one
from provisioner.cli.settings import connect

app = group("Projects: where jobs belong, inside your account.")
COLUMNS = [
    ("id", "ID"),
    ("ref", "NAME"),
    ("default", "DEFAULT"),
    ("description", "DESCRIPTION"),
    ("created_at", "CREATED"),
]
WIDE = [("account", "ACCOUNT"), ("shared_with", "SHARED WITH")]
Name = Annotated[str, typer.Argument(help="Project name or id.")]
Shown = Annotated[str, typer.Argument(help="Project name or id, or OWNER/PROJECT for one shared with you.")]
Account = Annotated[str, typer.Option("--account", help="The account (name or id) to share it with.")]


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
    """List your account's projects, then those other accounts share with it (OWNER/PROJECT)."""
    render.table(
        connect().get("/v1/projects")["items"],
        COLUMNS,
        wide=WIDE,
        as_json=json_out,
        empty="no project yet: `provision project create NAME`",
    )


@app.command("show")
@output_options
def show(name: Shown, json_out: Json = False) -> None:
    """Show one project (by name or id, or OWNER/PROJECT): whom it is shared with, for its owner."""
    show_one(f"/v1/projects/{name}", as_json=json_out)


@app.command("remove")
def remove(name: Name, yes: Yes = False, json_out: Json = False) -> None:
    """Remove a project; refused for the default project and while the project has jobs."""
    remove_one(f"remove project '{name}'?", f"/v1/projects/{name}", yes=yes, as_json=json_out)


@app.command("share")
def share(name: Name, account: Account, json_out: Json = False) -> None:
    """Share your project with another account: its members create jobs there (federated jobs, billed
    the federated fee; docs/billing.md). Admin tokens only."""
    answer = connect().post(f"/v1/projects/{name}/shares", {"account": account})
    render.detail(answer, as_json=json_out)


@app.command("unshare")
def unshare(name: Name, account: Account, json_out: Json = False) -> None:
    """Stop sharing your project with an account: no new jobs of it there; its jobs there run on."""
    render.detail(connect().delete(f"/v1/projects/{name}/shares/{account}"), as_json=json_out)
