"""`provision`: the operator's command line. Each command group is a module of provisioner/cli/;
adding one is ONE line in GROUPS below. Shared options and output live in common.py and render.py."""

from __future__ import annotations

import importlib
from typing import Annotated, Any

import typer
import typer.main

from provisioner.cli import backup, serve, status
from provisioner.cli.common import HELP_OPTIONS, OneLineErrors

# name: (its module in provisioner/cli, the module's Typer, modules that add commands to it). A group's
# modules are imported only when the command line names it (or asks for the list): `provision billing …`
# does not load the other groups' code: 0.56-0.59x the CPU of loading them all (bench cli, 2-core VM).
GROUPS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "provider": ("providers", "app", ()),
    "region": ("regions", "app", ("enrollment",)),  # + join-token, bundle, update
    "node": ("nodes", "app", ("adoption", "enrollment")),  # + accept, reject, pending, retry, …
    "device": ("devices", "app", ()),
    "device-config": ("device_configs", "app", ()),
    "lab": ("lab", "app", ()),
    "reservation": ("reservations", "app", ()),
    "datastore": ("datastores", "app", ()),
    "tpm-ca": ("enrollment", "tpm_ca", ()),
    "image": ("images", "app", ()),
    "token": ("tokens", "app", ()),
    "account": ("accounts", "app", ()),
    "project": ("projects", "app", ()),
    "job": ("jobs", "app", ()),
    "dataset": ("data_objects", "dataset_app", ()),
    "model": ("data_objects", "model_app", ()),
    "checkpoint": ("data_objects", "checkpoint_app", ()),
    "billing": ("billing", "app", ()),
    "price": ("billing", "price_app", ()),
}


def load_group(name: str) -> typer.core.TyperGroup:
    """The click group of GROUPS[name], with every command its modules add."""
    module, attribute, adders = GROUPS[name]
    for each in (module, *adders):
        importlib.import_module(f"provisioner.cli.{each}")
    group = typer.main.get_group(getattr(importlib.import_module(f"provisioner.cli.{module}"), attribute))
    group.name = name
    return group


class Provision(OneLineErrors):
    """The root group: its own commands, then GROUPS in their order, each loaded when first looked up."""

    # ctx: typer's vendored click Context (typed Any, as in common.OneLineErrors)
    def list_commands(self, ctx: Any) -> list[str]:
        return [*(n for n in super().list_commands(ctx) if n not in GROUPS), *GROUPS]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name in GROUPS and cmd_name not in self.commands:
            self.add_command(load_group(cmd_name), cmd_name)
        return super().get_command(ctx, cmd_name)


app = typer.Typer(
    help="rigbase control plane: providers, regions and nodes of your GPU fleet.",
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    cls=Provision,
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
