"""`provision project …`: the projects of this token's account — create, list, show, remove, share,
unshare (docs/accounts.md). Jobs belong to a project; `--project` defaults to the account's default
project, and names a project shared with this account as OWNER/PROJECT."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from contracts.jobspec import AUTOSTOP_MAX_MINUTES, NOTEBOOK_AUTOSTOP_MINUTES
from provisioner.cli import render
from provisioner.cli.common import (
    EXIT_USAGE,
    Json,
    Yes,
    fail,
    group,
    output_options,
    read_secret_file,
    remove_one,
    show_one,
)
from provisioner.cli.settings import connect

app = group("Projects: where jobs belong, inside your account.")
COLUMNS = [
    ("id", "ID"),
    ("ref", "NAME"),
    ("default", "DEFAULT"),
    ("description", "DESCRIPTION"),
    ("created_at", "CREATED"),
]
WIDE = [
    ("account", "ACCOUNT"),
    ("shared_with", "SHARED WITH"),
    ("notebook_autostop_minutes", "NOTEBOOK AUTOSTOP"),
]
Name = Annotated[str, typer.Argument(help="Project name or id.")]
Shown = Annotated[str, typer.Argument(help="Project name or id, or OWNER/PROJECT for one shared with you.")]
Account = Annotated[str, typer.Option("--account", help="The account (name or id) to share it with.")]
NotebookAutostop = Annotated[
    int | None,
    typer.Option(
        "--notebook-autostop",
        min=0,
        max=AUTOSTOP_MAX_MINUTES,
        metavar="MINUTES",
        help=f"Minutes a notebook that names no autostop may be idle before it is stopped (0: never; "
        f"default {NOTEBOOK_AUTOSTOP_MINUTES}).",
    ),
]


@app.command("create")
def create(
    name: Annotated[str, typer.Argument(help="DNS label, unique among your account's projects.")],
    description: Annotated[
        str | None, typer.Option("--description", "-d", help="One line: what the project is for.")
    ] = None,
    notebook_autostop: NotebookAutostop = None,
    json_out: Json = False,
) -> None:
    """Create a project in this token's account; prints its id."""
    body = {"name": name, "description": description, "notebook_autostop_minutes": notebook_autostop}
    render.created(connect().post("/v1/projects", body), as_json=json_out)


@app.command("update")
def update(
    name: Name,
    notebook_autostop: NotebookAutostop = None,
    default_autostop: Annotated[
        bool,
        typer.Option(
            "--default-notebook-autostop",
            help=f"Back to the built-in notebook autostop ({NOTEBOOK_AUTOSTOP_MINUTES} min).",
        ),
    ] = False,
    json_out: Json = False,
) -> None:
    """Change a project: its notebooks' default autostop (running notebooks follow it)."""
    if (notebook_autostop is None) == (not default_autostop):
        fail(
            "say one change: --notebook-autostop MINUTES or --default-notebook-autostop",
            exit_code=EXIT_USAGE,
        )
    row = connect().patch(f"/v1/projects/{name}", {"notebook_autostop_minutes": notebook_autostop})
    if json_out:
        render.print_json(row)
        return
    minutes = row["notebook_autostop_minutes"]
    said = f"{NOTEBOOK_AUTOSTOP_MINUTES} min (the default)" if minutes is None else f"{minutes} min"
    print(
        f"project {row['ref']}: notebooks without an autostop of their own stop after {said} idle"
        if minutes != 0
        else f"project {row['ref']}: notebooks without an autostop of their own never autostop"
    )


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


keys = group(
    "A project's third-party keys: a private registry's credentials, used to pull its jobs' images, and "
    "keys of AWS, GCP and Azure, which read datasets' and models' sources. "
    "The secret is stored encrypted and never shown again."
)
app.add_typer(keys, name="key")
KEY_COLUMNS = [
    ("kind", "KIND"),
    ("name", "NAME"),
    ("username", "USERNAME"),
    ("updated_at", "UPDATED"),
]
Registry = Annotated[
    str | None,
    typer.Option("--registry", help="The registry's host[:port], as the image names it: ghcr.io, nvcr.io."),
]
KeyKindOpt = Annotated[
    str,
    typer.Option("--kind", help="registry, aws, gcp, azure, huggingface, kaggle or wandb."),
]
KeyName = Annotated[
    str | None, typer.Option("--name", help="A label for a key that is not a registry's (default: default).")
]


def _key_name(kind: str, registry: str | None, name: str | None) -> str:
    if kind == "registry":
        if not registry:
            raise typer.BadParameter("a registry key needs --registry HOST (ghcr.io, nvcr.io, docker.io)")
        return registry
    if registry:
        raise typer.BadParameter(f"--registry is for registry keys: name a {kind} key with --name")
    return name or "default"


@keys.command("set")
def key_set(
    project: Name,
    username: Annotated[
        str, typer.Option("--username", "-u", help="The public half, shown: a username, an access key id.")
    ],
    secret_file: Annotated[
        Path,
        typer.Option("--secret-file", help="File (mode 600) holding the password or token; - reads stdin."),
    ],
    kind: KeyKindOpt = "registry",
    registry: Registry = None,
    name: KeyName = None,
    json_out: Json = False,
) -> None:
    """Add the project's key, or replace it; prints its id. Your jobs in this project pull images from a
    registry with its key (never a federated job of another account); an aws, gcp or azure key reads the
    project's s3://, gs:// and azure:// sources (docs/data.md)."""
    body = {
        "kind": kind,
        "name": _key_name(kind, registry, name),
        "username": username,
        "secret": read_secret_file(secret_file, "a file holding the password or token", called="secret file"),
    }
    render.created(connect().put(f"/v1/projects/{project}/keys", body), as_json=json_out)


@keys.command("list")
@output_options
def key_list(project: Name, json_out: Json = False) -> None:
    """List the project's keys (never their secrets)."""
    render.table(
        connect().get(f"/v1/projects/{project}/keys")["items"],
        KEY_COLUMNS,
        as_json=json_out,
        empty=f"no key yet: `provision project key set {project} --registry HOST -u USER --secret-file FILE`",
    )


@keys.command("remove")
def key_remove(
    project: Name,
    kind: KeyKindOpt = "registry",
    registry: Registry = None,
    name: KeyName = None,
    yes: Yes = False,
    json_out: Json = False,
) -> None:
    """Remove a key of the project: jobs pull from that registry anonymously, and sources it read are read
    without it, from now on."""
    label = _key_name(kind, registry, name)
    remove_one(
        f"remove the {kind} key {label} of project '{project}'?",
        f"/v1/projects/{project}/keys/{kind}/{label}",
        yes=yes,
        as_json=json_out,
        kind=f"{kind} key",
    )
