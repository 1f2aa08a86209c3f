"""`provision reservation …`: add, list, show, update, remove, assign, unassign, history."""

from __future__ import annotations

from typing import Annotated

import typer

from contracts.regional import Protocol
from provisioner.cli import render
from provisioner.cli.common import Json, RegionOpt, Yes, group, output_options, remove_one
from provisioner.cli.settings import connect

app = group(
    "Reservations: a HOST.local name and a port, published over mDNS by a node of the region (the one it "
    "is assigned to, or the one running its job); LAN-only unless --expose-wan (UPnP)."
)
COLUMNS = [
    ("id", "ID"),
    ("name", "NAME"),
    ("region", "REGION"),
    ("fqdn", "HOST"),
    ("port", "PORT"),
    ("protocol", "PROTO"),
    ("node", "NODE"),
    ("state", "STATE"),
    ("external_address", "EXTERNAL"),
    ("reason", "REASON"),
]
WIDE = [("job", "JOB"), ("wan", "WAN")]  # `-o wide`: the job holding it, LAN-only or exposed
HISTORY_COLUMNS = [
    ("at", "WHEN"),
    ("actor", "WHO"),
    ("from_state", "FROM"),
    ("to_state", "TO"),
    ("reason", "WHY"),
]
SHOW_FIELDS = [
    "id",
    "name",
    "region",
    "fqdn",
    "port",
    "protocol",
    "expose_wan",
    "node",
    "job",
    "state",
    "desired",
    "actual",
]
ExposeWan = Annotated[
    bool,
    typer.Option(
        "--expose-wan",
        help="Also map the port on the router (UPnP; only nodes with UPnP on): reachable from the WAN. "
        "Without it the reservation is LAN-only.",
    ),
]


def _row(r: dict) -> dict:
    """Table row: the actual address and reason next to the summary state."""
    return {
        **r,
        "wan": "exposed" if r.get("expose_wan") else "lan-only",
        "external_address": r["actual"]["external_address"],
        "reason": r["actual"]["reason"],
    }


@app.command("add")
def add(
    name: Annotated[str, typer.Argument(help="DNS label, unique in its region.")],
    region: Annotated[str, typer.Option("--region", "-r", help="Region of the reservation.")],
    hostname: Annotated[
        str, typer.Option("--hostname", help="DNS label published as HOSTNAME.local; unique in the region.")
    ],
    port: Annotated[int, typer.Option("--port", help="1-65535; unique in the region.")],
    protocol: Annotated[Protocol, typer.Option("--protocol", help="tcp or udp.")] = Protocol.TCP,
    expose_wan: ExposeWan = False,
    json_out: Json = False,
) -> None:
    """Add a reservation (unassigned, LAN-only unless --expose-wan); prints its id."""
    body = {
        "name": name,
        "region": region,
        "hostname": hostname,
        "port": port,
        "protocol": protocol.value,
        "expose_wan": expose_wan,
    }
    render.created(connect().post("/v1/reservations", body), as_json=json_out)


@app.command("update")
def update(
    name: str,
    expose_wan: Annotated[
        bool,
        typer.Option(
            "--expose-wan/--no-expose-wan",
            help="Map the port on the router (UPnP, nodes with UPnP on) or keep it LAN-only.",
        ),
    ],
    region: RegionOpt = None,
    json_out: Json = False,
) -> None:
    """Change whether the router maps the reservation's port; its node applies it on its next heartbeat."""
    body = connect().post(f"/v1/reservations/{name}/expose-wan", {"expose_wan": expose_wan}, region=region)
    render.detail(
        body, as_json=json_out, fields=None if json_out else ["id", "name", "expose_wan", "node", "state"]
    )


@app.command("list")
@output_options
def list_(
    region: Annotated[
        str | None, typer.Option("--region", "-r", help="Only this region's reservations.")
    ] = None,
    json_out: Json = False,
) -> None:
    """List reservations with their node and state (the node's report once it has one)."""
    rows = render.by_region_then_name(connect().get("/v1/reservations", region=region)["items"])
    render.table(
        rows if json_out else [_row(r) for r in rows],
        COLUMNS,
        wide=WIDE,
        as_json=json_out,
        empty="no reservation yet: `provision reservation add NAME --region R --hostname H --port P`",
    )


@app.command("show")
@output_options
def show(name: str, region: RegionOpt = None, json_out: Json = False) -> None:
    """Show one reservation: `desired` (operator) and `actual` (node report), a line per field."""
    row = connect().get(f"/v1/reservations/{name}", region=region)
    render.detail(row, as_json=json_out, fields=SHOW_FIELDS, nested=("desired", "actual"))


@app.command("remove")
def remove(name: str, region: RegionOpt = None, yes: Yes = False, json_out: Json = False) -> None:
    """Remove a reservation (its node withdraws the name on its next heartbeat)."""
    remove_one(
        f"remove reservation '{name}'?",
        f"/v1/reservations/{name}",
        yes=yes,
        as_json=json_out,
        fields=None if json_out else ["id", "name", "state"],
        region=region,
    )


@app.command("assign")
def assign(
    name: str,
    node: Annotated[str, typer.Option("--node", "-n", help="A compute node of the reservation's region.")],
    region: RegionOpt = None,
    json_out: Json = False,
) -> None:
    """Assign (or move) a reservation to a compute node; the node publishes it on its next heartbeat."""
    body = connect().post(f"/v1/reservations/{name}/assign", {"node": node}, region=region)
    render.detail(body, as_json=json_out, fields=None if json_out else ["id", "name", "node", "state"])


@app.command("unassign")
def unassign(name: str, region: RegionOpt = None, json_out: Json = False) -> None:
    """Unassign a reservation; its node sends mDNS goodbyes and removes the UPnP mapping."""
    body = connect().post(f"/v1/reservations/{name}/unassign", {}, region=region)
    render.detail(body, as_json=json_out, fields=None if json_out else ["id", "name", "node", "state"])


@app.command("history")
@output_options
def history(name: str, region: RegionOpt = None, json_out: Json = False) -> None:
    """Every change: operator decisions and the states the node reported."""
    rows = connect().get(f"/v1/reservations/{name}/history", region=region)["items"]
    render.table(rows, HISTORY_COLUMNS, as_json=json_out)
