"""Adopting and rejecting pending minions, salt-key's flow: `provision node accept|reject|unreject|rejected`.
Attaches to the `node` group (importing this module is the one line in main.py).

`accept` is `node add` for a minion that already called: its region comes from the pending list, so the
operator types a name, not a 32-character id from a console. `reject` refuses a minion_id's joins for good
(audited, `join_minion_rejected`) until `unreject`."""

from __future__ import annotations

import sys
from contextlib import redirect_stdout
from typing import Annotated, Any

import typer

from provisioner.cli import nodes, render
from provisioner.cli.common import EXIT_USAGE, Json, Yes, confirm, fail, output_options
from provisioner.cli.settings import connect
from provisioner.client import Client
from provisioner.domain import hardware_text
from provisioner.domain.states import Service

PASSING = hardware_text.requirements_line({"ok": True})  # the pending list's verdict: all rules pass
ADOPT_COLUMNS: render.Columns = [("minion_id", "MINION ID"), ("name", "NAME"), ("region", "REGION")]
REJECTED_COLUMNS: render.Columns = [
    ("minion_id", "MINION ID"),
    ("created_by", "BY"),
    ("created_at", "AGE", render.ago("created_at")),
    ("reason", "WHY"),
]


def _pending(client: Client) -> list[dict[str, Any]]:
    return list(client.get("/v1/pending-minions")["items"])


def default_name(minion_id: str) -> str:
    """The name `accept --all-passing` gives: a DNS label from the minion_id (rename by remove + add)."""
    return f"node-{minion_id[:8]}"


def _add(client: Client, minion_id: str, name: str, region: str, service: Service) -> dict[str, Any]:
    body = {"name": name, "region": region, "minion_id": minion_id, "service": service.value}
    return dict(client.post("/v1/nodes", body))


@nodes.app.command("accept")
def accept(
    minion_id: Annotated[
        str | None, typer.Argument(help="A pending minion's id (`provision node pending`).")
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="The node's name: a DNS label.")] = None,
    region: Annotated[
        str | None, typer.Option("--region", "-r", help="Default: the region the minion called with.")
    ] = None,
    service: Annotated[Service, typer.Option("--service", help="compute or storage.")] = Service.COMPUTE,
    all_passing: Annotated[
        bool,
        typer.Option(
            "--all-passing",
            help="Adopt every attested pending minion whose requirements pass, named node-<8 hex>.",
        ),
    ] = False,
    yes: Yes = False,
    json_out: Json = False,
) -> None:
    """Add the node for a pending minion (it joins at its next attempt); prints the node's id.

    Example: provision node accept 1646de49bc3444546030662664969053 --name gpu-01
    """
    client = connect()
    if all_passing:
        if minion_id or name:
            fail(
                "--all-passing adopts every passing minion: give no MINION_ID or --name", exit_code=EXIT_USAGE
            )
        _accept_all(client, region, service, yes=yes, as_json=json_out)
        return
    if not minion_id or not name:
        fail("give the pending MINION_ID and --name NAME (or --all-passing)", exit_code=EXIT_USAGE)
    row = next((r for r in _pending(client) if r["minion_id"] == minion_id), None)
    if row is None:
        fail(
            f"minion {minion_id} is not pending: see `provision node pending`, or add a node for a minion "
            f"that has not called yet with `provision node add {name} --region R --minion-id {minion_id}`"
        )
    if region is not None and region != row["region"]:
        fail(
            f"minion {minion_id} called with region {row['region']}'s bundle, not {region}'s: accept it "
            f"into {row['region']}, or boot it with {region}'s media first"
        )
    render.created(_add(client, minion_id, name, row["region"], service), as_json=json_out)


def _accept_all(client: Client, region: str | None, service: Service, *, yes: bool, as_json: bool) -> None:
    chosen = [
        {**r, "name": default_name(r["minion_id"])}
        for r in _pending(client)
        if r.get("attested")
        and r.get("requirements") == PASSING
        and (region is None or r["region"] == region)
    ]
    if not chosen:
        print("no attested pending minion passes its requirements: nothing to adopt", file=sys.stderr)
        if as_json:
            render.print_json([])
        return
    # the list goes to stderr with the question, so stdout keeps only the new ids
    table = render.by_region_then_name(chosen)
    with redirect_stdout(sys.stderr):
        render.table(table, ADOPT_COLUMNS)
    confirm(f"adopt these {len(chosen)} minion(s) as {service.value} nodes?", yes)
    added = [_add(client, r["minion_id"], r["name"], r["region"], service) for r in table]
    if as_json:
        render.print_json(added)
    else:
        for node in added:
            print(node["id"])


@nodes.app.command("reject")
def reject(
    minion_id: Annotated[str, typer.Argument(help="The minion's id (its TPM's EK).")],
    reason: Annotated[str | None, typer.Option("--reason", help="Why, for the audit trail.")] = None,
    json_out: Json = False,
) -> None:
    """Refuse every future join of this minion (audited); `provision node unreject` lifts it.

    Example: provision node reject 1646de49bc3444546030662664969053 --reason "not our hardware"
    """
    out = connect().post("/v1/rejected-minions", {"minion_id": minion_id, "reason": reason})
    if json_out:
        render.print_json(out)
    else:
        print(
            f"minion {minion_id} is rejected: its joins are refused until "
            f"`provision node unreject {minion_id}`"
        )


@nodes.app.command("unreject")
def unreject(minion_id: str, json_out: Json = False) -> None:
    """Let a rejected minion join again (it shows in `provision node pending` at its next attempt)."""
    out = connect().delete(f"/v1/rejected-minions/{minion_id}")
    if json_out:
        render.print_json(out)
    else:
        print(f"minion {minion_id} may join again: it shows in `provision node pending` at its next attempt")


@nodes.app.command("rejected")
@output_options
def rejected(json_out: Json = False) -> None:
    """Rejected minions: who rejected each, when and why."""
    render.table(
        connect().get("/v1/rejected-minions")["items"],
        REJECTED_COLUMNS,
        as_json=json_out,
        empty="no rejected minion",
    )
