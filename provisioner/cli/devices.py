"""`provision device …`: add, list, show, remove, history of edge inference devices (Jetsons).

A device is a node whose service is `device` (docs/devices.md): these commands are `provision node`'s
over the same /v1/nodes routes, narrowed to devices (a compute or storage node is refused with the
`provision node` command to use), and `show` adds the `device` section of the minion's inventory:
model, memory, L4T/JetPack, GPU cores, DLA, video and media devices, TPM kind."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any

import typer

from provisioner.cli import render
from provisioner.cli.common import Json, RegionOpt, Timeout, Wait, Yes, confirm, fail, group, output_options
from provisioner.cli.nodes import HISTORY_COLUMNS, print_added, print_listed, wanted_states
from provisioner.cli.settings import connect
from provisioner.client import Client, ControlPlaneError
from provisioner.domain.states import NODE_STOPPED, NodeState, Service

app = group("Devices: edge inference nodes (Jetsons) added by the minion_id on their sticker or console.")

DEVICE = Service.DEVICE.value
# A device is ready once active: it has no maintenance step (domain.states.DEVICE_TRANSITIONS).
READY, FAILED = frozenset({NodeState.ACTIVE}), NODE_STOPPED
# What `show` prints of the inventory's `device` section (contracts/device.py), in this order.
DEVICE_FIELDS = (
    "model",
    "model_name",
    "module",
    "chip_id",
    "memory_gib",
    "l4t_release",
    "jetpack",
    "gpu_cores",
    "dla_count",
    "tpm",
    "video_devices",
    "media_devices",
)
SHOW_FIELDS = (
    "id",
    "name",
    "region",
    "state",
    "reason",
    "online",
    "minion_id",
    "hostname",
    "last_heartbeat_at",
    "created_at",
    *DEVICE_FIELDS,
)


def _section(node: dict[str, Any]) -> dict[str, Any]:
    """The inventory's `device` section ({} until the device's minion has reported one)."""
    inventory = node.get("inventory")
    section = inventory.get("device") if isinstance(inventory, dict) else None
    return section if isinstance(section, dict) else {}


def _model(node: dict[str, Any]) -> str:
    section = _section(node)
    return str(section.get("model_name") or section.get("model") or "-")


def _jetpack(node: dict[str, Any]) -> str:
    return str(_section(node).get("jetpack") or "-")


COLUMNS: render.Columns = [
    ("id", "ID"),
    ("name", "NAME"),
    ("region", "REGION"),
    ("state", "STATE"),
    ("online", "ONLINE"),
    ("model", "MODEL", _model),
    ("last_heartbeat_at", "LAST SEEN", render.ago("last_heartbeat_at")),
    ("created_at", "AGE", render.ago("created_at")),
]
WIDE_COLUMNS: render.Columns = [
    ("minion_id", "MINION ID"),
    ("hostname", "HOSTNAME"),
    ("jetpack", "JETPACK", _jetpack),
    ("reason", "REASON"),
]


def _not_a_device(node: dict[str, Any]) -> None:
    if node.get("service") != DEVICE:
        fail(
            f"'{node['name']}' in region '{node['region']}' is a {node.get('service')} node, not a device: "
            f"use `provision node show {node['name']}`"
        )


def _device(client: Client, ref: str, region: str | None) -> dict[str, Any]:
    """The live device named (or with the id) `ref`; a node of another service is refused."""
    node: dict[str, Any] = client.get(f"/v1/nodes/{ref}", region=region)
    _not_a_device(node)
    return node


def _devices(client: Client, region: str | None, include_removed: bool) -> Iterator[dict[str, Any]]:
    return client.pages(
        "/v1/nodes", region=region, service=DEVICE, include_removed="true" if include_removed else None
    )


@app.command("add")
def add(
    name: Annotated[str, typer.Argument(help="DNS label, unique among the nodes of its region.")],
    region: Annotated[str, typer.Option("--region", "-r", help="A physical region with central storage.")],
    minion_id: Annotated[
        str, typer.Option("--minion-id", help="32 hex characters from the device's sticker or console.")
    ],
    hostname: Annotated[
        str | None, typer.Option("--hostname", help="DNS name the device is reached at.")
    ] = None,
    wait: Wait = False,
    timeout: Timeout = 1800,
    json_out: Json = False,
) -> None:
    """Add a device by minion_id; prints its id. With --wait, waits until it is active.

    Example: provision device add cam-1 --region edge-1 --minion-id 0123456789abcdef0123456789abcdef
    """
    client = connect()
    body = {"name": name, "region": region, "minion_id": minion_id, "service": DEVICE, "hostname": hostname}
    node = client.post("/v1/nodes", body)
    print_added(client, node, wait=wait, timeout=timeout, as_json=json_out, done=READY, failed=FAILED)


@app.command("list")
@output_options
def list_(
    region: Annotated[str | None, typer.Option("--region", "-r", help="Only this region's devices.")] = None,
    state: Annotated[
        list[NodeState] | None, typer.Option("--state", help="Only devices in this state (repeatable).")
    ] = None,
    removed: Annotated[bool, typer.Option("--removed", help="Include removed devices.")] = False,
    json_out: Json = False,
) -> None:
    """List devices, by region then name. `-o wide` adds minion id, hostname, JetPack and reason.

    Example: provision device list --region edge-1 --state errored -o wide
    """
    wanted, include_removed = wanted_states(state, removed)
    rows = [
        row for row in _devices(connect(), region, include_removed) if not wanted or row["state"] in wanted
    ]
    empty = (
        "no device matches these filters"
        if wanted
        else "no device yet: `provision device add NAME --region R --minion-id ID`"
    )
    print_listed(rows, COLUMNS, WIDE_COLUMNS, as_json=json_out, empty=empty)


@app.command("show")
@output_options
def show(name: str, region: RegionOpt = None, json_out: Json = False) -> None:
    """Show one device (by name or id) with what its minion reports of the hardware: model, memory,
    L4T/JetPack, GPU cores, DLA, video and media devices, TPM kind (firmware or none)."""
    client = connect()
    node = _device(client, name, region)
    section = _section(node)
    if render.chosen(json_out) in (render.Output.JSON, render.Output.YAML):
        render.detail({**node, "device": section or None}, as_json=json_out)
        return
    shown = {**node, **{field: section.get(field) for field in DEVICE_FIELDS}}
    for field in ("video_devices", "media_devices"):  # lists of device paths: one cell each
        if isinstance(shown[field], list):
            shown[field] = ", ".join(map(str, shown[field])) or "none"
    if isinstance(shown["chip_id"], int):  # as NVIDIA writes it: 0x23 is Orin (tegra234)
        shown["chip_id"] = f"0x{shown['chip_id']:02x}"
    render.detail(shown, fields=SHOW_FIELDS)


@app.command("remove")
def remove(name: str, region: RegionOpt = None, yes: Yes = False, json_out: Json = False) -> None:
    """Remove a device (kept as `removed` in its history; its name and minion_id may be reused)."""
    client = connect()
    node = _device(client, name, region)
    confirm(f"remove device '{node['name']}' in region '{node['region']}'?", yes)
    render.detail(client.delete(f"/v1/nodes/{node['id']}"), as_json=json_out)


@app.command("history")
@output_options
def history(name: str, region: RegionOpt = None, json_out: Json = False) -> None:
    """Every state change of a device, removed ones included: when, who, from, to, why."""
    client = connect()
    try:
        node = _device(client, name, region)
    except ControlPlaneError as exc:
        if exc.status != 404:
            raise
        # not live: the newest removed device with that name or id
        gone = [r for r in _devices(client, region, True) if name in (r["name"], r["id"])]
        if not gone:
            raise
        node = max(gone, key=lambda r: str(r["created_at"]))
    rows = client.get(f"/v1/nodes/{node['id']}/history")["items"]
    render.table(rows, HISTORY_COLUMNS, as_json=json_out)
