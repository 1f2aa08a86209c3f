"""`provision device …`: add, list, show, remove, history of edge inference devices (Jetsons).

A device is a node whose service is `device` (docs/devices.md): these commands are `provision node`'s
over the same /v1/nodes routes, narrowed to devices (a compute or storage node is refused with the
`provision node` command to use), and `show` adds the `device` section of the minion's inventory:
model, memory, L4T/JetPack, GPU cores, DLA, video and media devices, TPM kind."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Annotated, Any

import typer

from provisioner.cli import render
from provisioner.cli.common import Json, RegionOpt, Timeout, Wait, Yes, confirm, fail, group, output_options
from provisioner.cli.errors import EXIT_USAGE
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
    "identity",
    "hostname",
    "last_heartbeat_at",
    "last_quote_at",
    "created_at",
    *DEVICE_FIELDS,
)
# `identity` as `show` prints it: what the device proved itself with at its last join
IDENTITY_TEXT = {
    "tpm": "tpm (EK, AK and PCRs attested)",
    "device-key": "device key (no TPM: a key file on the device, no boot measurements)",
}
# Configuration Status and Inference Status (GET /v1/nodes/{ref}/device-status), in this order
STATUS_FIELDS = (
    "config",
    "config_revision",
    "latest_revision",
    "deployed_revision",
    "deployed_at",
    "inference_status",
    "inference_message",
    "exit_code",
    "last_lines",
    "reported_at",
)
STATUS_COLUMNS: render.Columns = [
    ("device", "DEVICE"),
    ("region", "REGION"),
    ("config", "CONFIG"),
    ("deployed_revision", "REVISION"),
    ("latest_revision", "LATEST"),
    ("inference_status", "INFERENCE"),
    ("deployed_at", "DEPLOYED", render.ago("deployed_at")),
]
STATUS_WIDE: render.Columns = [("exit_code", "EXIT"), ("inference_message", "MESSAGE")]
FOLLOW_EVERY_S = 1.0


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
    L4T/JetPack, GPU cores, DLA, video and media devices, TPM kind (firmware or none), and what it
    proved itself with at join (its TPM, or a device key where the region allows devices without one)."""
    client = connect()
    node = _device(client, name, region)
    section = _section(node)
    status = client.get(f"/v1/nodes/{node['id']}/device-status")
    if render.is_machine(json_out):
        render.detail({**node, "device": section or None, "configuration": status}, as_json=json_out)
        return
    shown = {**node, **{field: section.get(field) for field in DEVICE_FIELDS}, **_status_cells(status)}
    for field in ("video_devices", "media_devices"):  # lists of device paths: one cell each
        if isinstance(shown[field], list):
            shown[field] = ", ".join(map(str, shown[field])) or "none"
    shown["identity"] = IDENTITY_TEXT.get(shown.get("identity") or "", "not joined yet")
    if isinstance(shown["chip_id"], int):  # as NVIDIA writes it: 0x23 is Orin (tegra234)
        shown["chip_id"] = f"0x{shown['chip_id']:02x}"
    render.detail(shown, fields=(*SHOW_FIELDS, *STATUS_FIELDS))


def _status_cells(status: dict[str, Any]) -> dict[str, Any]:
    """The status as `show` prints it: the last lines on one line each (a table cell)."""
    cells = {field: status.get(field) for field in STATUS_FIELDS}
    if cells["config"] is None:
        cells["config"] = "none: `provision device set-config DEVICE CONFIG`"
    if isinstance(cells["last_lines"], str):
        cells["last_lines"] = " | ".join(cells["last_lines"].splitlines()[-5:])
    return cells


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


@app.command("set-config")
def set_config(
    name: Annotated[str, typer.Argument(help="The device (name or id).")],
    config: Annotated[str, typer.Argument(help="A device configuration of the device's region.")],
    region: RegionOpt = None,
    json_out: Json = False,
) -> None:
    """Choose the configuration a device runs (its latest revision); `provision device deploy` starts it.

    Example: provision device set-config cam-1 detect && provision device deploy cam-1
    """
    client = connect()
    node = _device(client, name, region)
    answer = client.request("PUT", f"/v1/nodes/{node['id']}/device-config", json={"config": config})
    render.detail(answer, as_json=json_out, fields=("device", "config", "config_revision", "latest_revision"))


@app.command("deploy")
def deploy(
    name: Annotated[
        str | None, typer.Argument(help="The device (name or id); or --config for every device set to it.")
    ] = None,
    config: Annotated[
        str | None, typer.Option("--config", help="Deploy every device set to this configuration.")
    ] = None,
    latest: Annotated[
        bool, typer.Option("--latest", help="The configuration's latest revision (not the one set).")
    ] = False,
    region: RegionOpt = None,
    json_out: Json = False,
) -> None:
    """Deploy a device's configuration: the device replaces its inference container at its next heartbeat.

    Example: provision device deploy cam-1 --latest; provision device deploy --config detect --latest
    """
    if (name is None) == (config is None):
        fail("name one device, or pass --config CONFIG for every device set to it", exit_code=EXIT_USAGE)
    client = connect()
    if name is not None:
        node = _device(client, name, region)
        answer = client.post(f"/v1/nodes/{node['id']}/deploy", {"latest": latest})
        render.detail(answer, as_json=json_out, fields=("device", *STATUS_FIELDS[:6]))
        return
    rows = client.post(f"/v1/device-configs/{config}/deploy", {"latest": latest}, region=region)["items"]
    render.table(rows, STATUS_COLUMNS, as_json=json_out)


@app.command("status")
@output_options
def status(
    name: Annotated[str | None, typer.Argument(help="One device (default: every configured device).")] = None,
    region: RegionOpt = None,
    json_out: Json = False,
) -> None:
    """Configuration Status (revision, when deployed) and Inference Status (deploying, running, exited with
    its code and last lines, failed with why) of one device, or a table of every configured device."""
    client = connect()
    if name is None:
        rows = client.get("/v1/device-status", region=region)["items"]
        empty = "no device has a configuration: `provision device set-config DEVICE CONFIG`"
        render.table(rows, STATUS_COLUMNS, wide=STATUS_WIDE, as_json=json_out, empty=empty)
        return
    node = _device(client, name, region)
    answer = client.get(f"/v1/nodes/{node['id']}/device-status")
    render.detail(answer, as_json=json_out, fields=("device", "region", *STATUS_FIELDS))


@app.command("logs")
def logs(
    name: Annotated[str, typer.Argument(help="The device (name or id).")],
    region: RegionOpt = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing until the container ends (Ctrl-C stops).")
    ] = False,
) -> None:
    """The output of the device's inference container (its newest one), shipped by the device over its
    own outbound connection; --follow waits for more."""
    client = connect()
    node = _device(client, name, region)
    offset, generation = 0, None
    while True:
        page = client.get(f"/v1/nodes/{node['id']}/device-logs", offset=offset, generation=generation)
        if page["data"]:
            sys.stdout.write(page["data"])
            sys.stdout.flush()
        offset, generation = page["next_offset"], page["generation"]
        if page["complete"] or (not follow and page["next_offset"] == page["offset"]):
            return
        if follow:
            time.sleep(FOLLOW_EVERY_S)
