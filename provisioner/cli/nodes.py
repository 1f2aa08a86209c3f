"""`provision node …`: add, list, show, remove, replace, maintenance, history."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from provisioner.cli import render
from provisioner.cli.common import (
    Json,
    RegionOpt,
    Timeout,
    Wait,
    Yes,
    confirm,
    fail,
    group,
    output_options,
    remove_one,
)
from provisioner.cli.settings import connect
from provisioner.cli.wait import wait_for_node
from provisioner.client import Client
from provisioner.domain import hardware_text
from provisioner.domain.states import NODE_READY, NODE_STOPPED, Maintenance, NodeState, Service

app = group("Nodes: servers added by the minion_id shown on their console.")
# the default table fits 120 columns with names of up to ~20 characters; `-o wide` adds the rest
COLUMNS: render.Columns = [
    ("id", "ID"),
    ("name", "NAME"),
    ("region", "REGION"),
    ("service", "SERVICE"),
    ("state", "STATE"),
    ("online", "ONLINE"),
    ("gpus", "GPUS", render.gpu_summary),
    ("last_heartbeat_at", "LAST SEEN", render.ago("last_heartbeat_at")),
    ("created_at", "AGE", render.ago("created_at")),
]
WIDE_COLUMNS: render.Columns = [("minion_id", "MINION ID"), ("hostname", "HOSTNAME"), ("reason", "REASON")]
HISTORY_COLUMNS = [
    ("at", "WHEN"),
    ("actor", "WHO"),
    ("from_state", "FROM"),
    ("to_state", "TO"),
    ("reason", "WHY"),
]
# a freshly added node is ready (or failed) once its minion has joined and playbooks have run
READY, FAILED = NODE_READY, NODE_STOPPED  # what `--wait` stops at


def print_added(
    client: Client,
    node: dict[str, Any],
    *,
    wait: bool,
    timeout: float,
    as_json: bool,
    done: frozenset[NodeState] = READY,
    failed: frozenset[NodeState] = FAILED,
) -> None:
    """A node just added (or replaced): its id, or with `wait` the id first (the node exists whatever the
    wait's outcome), then the wait until it is in `done`; as JSON, the node (the ready one after a wait).
    Shared with `provision device add`, whose devices are ready at another state."""
    if not wait:
        render.created(node, as_json=as_json)
        return
    if not as_json:
        print(node["id"], flush=True)
    ready = wait_for_node(client, node, done=done, failed=failed, timeout=timeout)
    if as_json:
        render.print_json(ready)


def print_listed(
    rows: list[dict[str, Any]], columns: render.Columns, wide: render.Columns, *, as_json: bool, empty: str
) -> None:
    """`list`'s table of nodes (or devices), by region then name; `empty` says what to do when none."""
    render.table(render.by_region_then_name(rows), columns, wide=wide, as_json=as_json, empty=empty)


def wanted_states(state: list[NodeState] | None, removed: bool) -> tuple[set[str], bool]:
    """`list --state`'s states, and whether removed nodes are fetched: --removed, or --state removed."""
    wanted = {s.value for s in state or ()}
    return wanted, removed or NodeState.REMOVED.value in wanted


@app.command("add")
def add(
    name: Annotated[str, typer.Argument(help="DNS label, unique in its region.")],
    region: Annotated[str, typer.Option("--region", "-r", help="Region to add the node to.")],
    minion_id: Annotated[
        str | None, typer.Option("--minion-id", help="32 hex characters shown on the node's console.")
    ] = None,
    gpu_type: Annotated[
        str | None,
        typer.Option(
            "--gpu-type", help="GCP regions: a VM with this GPU (e.g. A100) instead of a machine of yours."
        ),
    ] = None,
    gpu_count: Annotated[int, typer.Option("--gpu-count", help="With --gpu-type: 1, 2, 4 or 8.")] = 1,
    reservation: Annotated[
        str | None,
        typer.Option("--reservation", help="With --gpu-type: the Compute reservation (committed) it uses."),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="With --gpu-type: show the VM and its price; create nothing.")
    ] = False,
    service: Annotated[
        Service, typer.Option("--service", help="compute or storage (one storage node per region).")
    ] = Service.COMPUTE,
    hostname: Annotated[
        str | None, typer.Option("--hostname", help="DNS name the node is reached at.")
    ] = None,
    upnp: Annotated[
        bool, typer.Option("--upnp/--no-upnp", help="Open ports with UPnP (off behind corporate firewalls).")
    ] = True,
    mining: Annotated[bool, typer.Option("--mining/--no-mining", help="Mine when idle.")] = False,
    wait: Wait = False,
    timeout: Timeout = 1800,
    json_out: Json = False,
) -> None:
    """Add a node by minion_id (or, in a GCP region, a VM with --gpu-type); prints its id. With --wait,
    waits until it has joined."""
    if gpu_type is not None and minion_id is not None:
        fail("--gpu-type makes a VM whose minion_id comes from its vTPM: leave out --minion-id", exit_code=2)
    if gpu_type is None and minion_id is None:
        fail(
            "--minion-id is required (or --gpu-type for a VM in a GCP region): see `provision node add -h`",
            exit_code=2,
        )
    client = connect()
    if gpu_type is not None:
        out = client.post(
            "/v1/gcp/nodes",
            {
                "name": name,
                "region": region,
                "gpu_type": gpu_type,
                "gpu_count": gpu_count,
                "reservation": reservation,
                "dry_run": dry_run,
            },
        )
        if dry_run:
            render.detail(out, as_json=json_out)
            return
        print_added(client, out["node"], wait=wait, timeout=timeout, as_json=json_out)
        return
    node = client.post(
        "/v1/nodes",
        {
            "name": name,
            "region": region,
            "minion_id": minion_id,
            "service": service.value,
            "hostname": hostname,
            "upnp": upnp,
            "mining": mining,
        },
    )
    print_added(client, node, wait=wait, timeout=timeout, as_json=json_out)


@app.command("list")
@output_options
def list_(
    region: Annotated[str | None, typer.Option("--region", "-r", help="Only this region's nodes.")] = None,
    state: Annotated[
        list[NodeState] | None, typer.Option("--state", help="Only nodes in this state (repeatable).")
    ] = None,
    service: Annotated[
        Service | None, typer.Option("--service", help="Only compute or storage nodes.")
    ] = None,
    removed: Annotated[bool, typer.Option("--removed", help="Include removed nodes.")] = False,
    json_out: Json = False,
) -> None:
    """List nodes (every page), by region then name. `-o wide` adds minion id, hostname and reason.

    Example: provision node list --region lab-1 --state errored --state new -o wide
    """
    # the API filters by region; state and service are filtered here (the list is paged in full anyway)
    wanted, include_removed = wanted_states(state, removed)
    rows = [
        row
        for row in connect().pages("/v1/nodes", region=region, include_removed=include_removed or None)
        if (not wanted or row["state"] in wanted) and (service is None or row["service"] == service.value)
    ]
    filtered = bool(wanted or service)
    empty = (
        "no node matches these filters"
        if filtered
        else "no node yet: `provision node pending`, then `provision node accept MINION_ID --name NAME`"
    )
    print_listed(rows, COLUMNS, WIDE_COLUMNS, as_json=json_out, empty=empty)


@app.command("show")
@output_options
def show(name: str, region: RegionOpt = None, json_out: Json = False) -> None:
    """Show one node (by name or id): its inventory and requirements as one line each (the reports
    themselves with `-o yaml` or `-o json`)."""
    node = connect().get(f"/v1/nodes/{name}", region=region)
    if not render.is_machine(json_out):
        node |= {
            "inventory": hardware_text.one_line(node.get("inventory") or {}),
            "requirements": hardware_text.requirements_line(node.get("requirements") or {}),
        }
        if node.get("gpu_health"):
            node["gpu_health"] = hardware_text.gpu_health_line(node["gpu_health"])
    render.detail(node, as_json=json_out)


@app.command("remove")
def remove(
    name: str,
    region: RegionOpt = None,
    force: Annotated[
        bool,
        typer.Option("--force", help="A storage node: remove it even while compute nodes use its cache."),
    ] = False,
    yes: Yes = False,
    json_out: Json = False,
) -> None:
    """Remove a node (kept as `removed` in the history); the reservations it served become unassigned."""
    params: dict[str, Any] = {"region": region, **({"force": "true"} if force else {})}
    remove_one(f"remove node '{name}'?", f"/v1/nodes/{name}", yes=yes, as_json=json_out, **params)


@app.command("replace")
def replace(
    old: Annotated[str, typer.Argument(help="The storage node to replace.")],
    minion_id: Annotated[str, typer.Option("--minion-id", help="minion_id of the new hardware.")],
    region: RegionOpt = None,
    yes: Yes = False,
    wait: Wait = False,
    timeout: Timeout = 1800,
    json_out: Json = False,
) -> None:
    """Swap a storage node's hardware: same name and settings, new minion_id; prints the new id."""
    confirm(f"replace storage node '{old}' with minion {minion_id}?", yes)
    client = connect()
    node = client.post(f"/v1/nodes/{old}/replace", {"minion_id": minion_id}, region=region)
    print_added(client, node, wait=wait, timeout=timeout, as_json=json_out)


@app.command("maintenance")
def maintenance(
    name: str,
    mode: Annotated[Maintenance, typer.Argument(help="on, off, or toggle.")],
    reason: Annotated[str | None, typer.Option("--reason", help="Why, for the history.")] = None,
    region: RegionOpt = None,
    json_out: Json = False,
) -> None:
    """Put a node into maintenance (on) or back to active (off); asking for the state it is in is fine."""
    client = connect()
    before = client.get(f"/v1/nodes/{name}", region=region)["state"]
    node = client.post(f"/v1/nodes/{name}/maintenance", {"mode": mode.value, "reason": reason}, region=region)
    if node["state"] == before and mode is not Maintenance.TOGGLE:
        print(f"node {node['name']} is already {before}: nothing to do", file=sys.stderr)
    fields = None if json_out else ["id", "name", "region", "state", "online"]
    render.detail(node, as_json=json_out, fields=fields)


@app.command("history")
@output_options
def history(
    name: str,
    region: RegionOpt = None,
    tasks: Annotated[
        bool, typer.Option("--tasks", help="Every playbook task on its own line (else a play is one line).")
    ] = False,
    json_out: Json = False,
) -> None:
    """Every state change of a node: when, who, from, to, why (the reason is never shortened)."""
    from provisioner.domain.task_lines import fold_tasks  # contracts.finalize's models: only here

    rows = connect().get(f"/v1/nodes/{name}/history", region=region)["items"]
    if not tasks and not render.is_machine(json_out):
        rows = fold_tasks(rows)
    render.table(rows, HISTORY_COLUMNS, as_json=json_out, keep=("actor", "from_state", "to_state", "reason"))
