"""`provision token …`: operator tokens — create, list, show, rotate, revoke (docs/control-plane.md). Each
token belongs to an account with a role, admin or member (docs/accounts.md)."""

from __future__ import annotations

from typing import Annotated

import typer

from provisioner.cli import render
from provisioner.cli.common import Json, Yes, group, output_options, remove_one, show_one
from provisioner.cli.settings import connect
from provisioner.domain.roles import Role

app = group("Operator tokens: who may use this API. A token's secret is printed once.")
COLUMNS = [
    ("id", "ID"),
    ("name", "NAME"),
    ("role", "ROLE"),
    ("state", "STATE"),
    ("expires_at", "EXPIRES"),
    ("last_used_at", "LAST USED"),
    ("created_at", "CREATED"),
]
WIDE = [("account_id", "ACCOUNT")]
Ttl = Annotated[
    str | None,
    typer.Option("--ttl", help="Lifetime: 30m, 24h, 7d, 2w (at most 365d); default: never expires."),
]


def _print_secret(out: dict, as_json: bool) -> None:
    if as_json:
        render.print_json(out)
    else:
        # the id on stdout's first line (scripts), the secret on the second: it is shown only now
        print(out["id"])
        print(out["token"])


@app.command("create")
def create(
    name: Annotated[str, typer.Argument(help="Lowercase letters, digits and '-'; who or what uses it.")],
    ttl: Ttl = None,
    account: Annotated[
        str | None,
        typer.Option(
            "--account", "-a", help="Account (name or id) it belongs to; default: yours. Others: root admins."
        ),
    ] = None,
    role: Annotated[
        Role,
        typer.Option(
            "--role",
            help="admin: manages the account's tokens; member: projects and jobs; scrape: GET /metrics only.",
        ),
    ] = Role.ADMIN,
    json_out: Json = False,
) -> None:
    """Create a token; prints its id, then the token (shown only this once)."""
    body = {"name": name, "ttl": ttl, "account": account, "role": role.value}
    _print_secret(connect().post("/v1/operator-tokens", body), json_out)


@app.command("list")
@output_options
def list_(json_out: Json = False) -> None:
    """List operator tokens (never their secrets)."""
    render.table(connect().get("/v1/operator-tokens")["items"], COLUMNS, wide=WIDE, as_json=json_out)


@app.command("show")
@output_options
def show(name: str, json_out: Json = False) -> None:
    """Show one token (by name or id)."""
    show_one(f"/v1/operator-tokens/{name}", as_json=json_out)


@app.command("rotate")
def rotate(name: str, ttl: Ttl = None, json_out: Json = False) -> None:
    """Give a token a new secret; the old one stops working on the next request."""
    _print_secret(connect().post(f"/v1/operator-tokens/{name}/rotate", {"ttl": ttl}), json_out)


@app.command("revoke")
def revoke(name: str, yes: Yes = False, json_out: Json = False) -> None:
    """Revoke a token for good; requests with it are refused from the next one on."""
    remove_one(
        f"revoke operator token '{name}'?",
        f"/v1/operator-tokens/{name}",
        yes=yes,
        as_json=json_out,
        kind="operator token",
        verb="revoked",
    )
