"""`provision provider …`: enable, list, show, remove."""

from __future__ import annotations

from typing import Annotated

import typer

from provisioner.cli import render
from provisioner.cli.common import Json, Timeout, Wait, Yes, group, output_options, remove_one, show_one
from provisioner.cli.settings import connect

app = group("Providers: where nodes come from (physical servers, GCP).")
COLUMNS = [
    ("id", "ID"),
    ("kind", "KIND"),
    ("payment_mode", "PAYMENT"),
    ("state", "STATE"),
    ("reason", "REASON"),
]


@app.command("enable")
def enable(
    kind: Annotated[str, typer.Argument(help="Provider kind: physical or gcp.")],
    payment_mode: Annotated[
        str | None, typer.Option("--payment-mode", help="How usage is paid (physical: credits).")
    ] = None,
    credentials: Annotated[
        str | None, typer.Option("--credentials", help="gcp: service-account JSON key file, or - for stdin.")
    ] = None,
    prefix: Annotated[
        str | None,
        typer.Option("--prefix", help="gcp: name prefix of everything rigbase creates (default rigbase)."),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="gcp: check the key and permissions, list what would be created, create nothing.",
        ),
    ] = False,
    wait: Wait = False,
    timeout: Timeout = 600,
    json_out: Json = False,
) -> None:
    """Enable a provider; prints its id."""
    if kind == "gcp":
        from provisioner.cli import gcp

        return gcp.enable(credentials, prefix, payment_mode, dry_run, json_out, wait, timeout)
    body = {"kind": kind, "payment_mode": payment_mode}
    render.created(connect().post("/v1/providers", body), as_json=json_out)


@app.command("list")
@output_options
def list_(json_out: Json = False) -> None:
    """List enabled providers."""
    render.table(
        connect().get("/v1/providers")["items"],
        COLUMNS,
        as_json=json_out,
        empty="no provider enabled: `provision provider enable physical`",
    )


@app.command("show")
@output_options
def show(kind: str, json_out: Json = False) -> None:
    """Show one provider (by kind or id)."""
    show_one(f"/v1/providers/{kind}", as_json=json_out)


@app.command("remove")
def remove(kind: str, yes: Yes = False, json_out: Json = False) -> None:
    """Remove a provider that has no regions left."""
    remove_one(f"remove provider '{kind}'?", f"/v1/providers/{kind}", yes=yes, as_json=json_out)
