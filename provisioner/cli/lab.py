"""`provision lab …`: the local lab (a region of simulated nodes on this machine; docs/lab.md)."""

from __future__ import annotations

import contextlib
import io
import sys
from typing import Annotated, Any

import typer

from provisioner.cli import render
from provisioner.cli.common import EXIT_USAGE, Json, Yes, confirm, fail, from_refusal, group
from provisioner.cli.enrollment import PENDING_COLUMNS

app = group(
    "Local lab: a control plane and simulated nodes (swtpm, umockdev, network namespaces) on this machine."
)
NODE_COLUMNS = [
    ("name", "NODE"),
    ("minion_id", "MINION ID"),
    ("state", "STATE"),
    ("online", "ONLINE"),
    ("netns", "NAMESPACE"),
    ("address", "ADDRESS"),
    ("join_seconds", "JOIN S"),
    ("reason", "REASON"),
]
# devices (`lab up --devices N`) get a table of their own: the node table stays as it was
DEVICE_COLUMNS = [
    ("name", "DEVICE"),
    ("minion_id", "MINION ID"),
    ("model", "MODEL"),
    ("state", "STATE"),
    ("online", "ONLINE"),
    ("netns", "NAMESPACE"),
    ("address", "ADDRESS"),
    ("join_seconds", "JOIN S"),
    ("reason", "REASON"),
]
NS_COLUMNS = [("name", "NAMESPACE"), ("address", "ADDRESS"), ("exists", "EXISTS")]
PROC_COLUMNS = [("kind", "PROCESS"), ("node", "NODE"), ("pid", "PID"), ("alive", "ALIVE")]


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _pending_table(rows: list[dict[str, Any]]) -> str:
    """The lab's pending minions as `provision node pending` shows them (the lab itself returns rows)."""
    with contextlib.redirect_stdout(io.StringIO()) as table:
        render.table(rows, PENDING_COLUMNS, as_json=False)
    return table.getvalue()


def _run(fn: Any, *args: Any, **kwargs: Any) -> Any:
    from contracts.errors import RigbaseError

    try:
        return fn(*args, **kwargs)
    except RigbaseError as exc:
        raise from_refusal(exc) from exc


def _is_device(row: dict[str, Any]) -> bool:
    return row.get("service") == "device"


def _device_row(row: dict[str, Any]) -> dict[str, Any]:
    """The model the device's minion reported (its `device` section), else the lab profile it runs."""
    inventory = row.get("inventory")
    section = (inventory.get("device") if isinstance(inventory, dict) else None) or {}
    return row | {"model": section.get("model_name") or section.get("model") or row.get("profile") or "-"}


def _show_nodes(nodes: list[dict[str, Any]]) -> None:
    machines = [n for n in nodes if not _is_device(n)]
    render.table(machines, NODE_COLUMNS, as_json=False, empty="no lab node yet")
    devices = [_device_row(n) for n in nodes if _is_device(n)]
    if devices:
        print()
        render.table(devices, DEVICE_COLUMNS, as_json=False)


@app.command("up")
def up(
    nodes: Annotated[int, typer.Option("--nodes", "-n", help="How many simulated nodes (1-16).")] = 2,
    upnp: Annotated[
        bool, typer.Option("--upnp", help="Also a router (miniupnpd) and a WAN namespace.")
    ] = False,
    devices: Annotated[
        int,
        typer.Option(
            "--devices",
            help="How many simulated Jetson Orin devices (0-16; makes the region central, node-1 its "
            "storage node).",
        ),
    ] = 0,
    control_planes: Annotated[
        int,
        typer.Option(
            "--control-planes",
            help="How many control-plane hosts (1-5). More than one: each host serves in its own namespace "
            'on one PostgreSQL, behind HAProxy (docs/lab.md, "Several control planes").',
        ),
    ] = 1,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds to wait for the nodes to reach maintenance.", min=1)
    ] = 600,
    json_out: Json = False,
) -> None:
    """Start the lab (or finish starting it): control plane, region `lab`, N nodes joined and in
    maintenance."""
    from provisioner.lab import lifecycle
    from provisioner.lab.topology import LabPlan

    try:
        plan = LabPlan(nodes=nodes, upnp=upnp, devices=devices, control_planes=control_planes)
    except ValueError as exc:
        fail(str(exc), exit_code=EXIT_USAGE)
    _run(
        lifecycle.up,
        plan,
        progress=_progress,
        pending=_pending_table,
        timeout=timeout,
    )
    report = _run(lifecycle.status)
    if json_out:
        render.print_json(report)
        return
    _show_nodes(report["nodes"])
    compute = [n["name"] for n in report["nodes"] if n.get("service") == "compute"]
    first = compute[0] if compute else "node-1"
    print(
        f"\nThe lab is up. Plain `provision …` commands in this RIGBASE_HOME ({report['home']}) "
        "use its control plane.\n"
        f"Next: activate a node       provision node maintenance {first} off\n"
        f"      see its history       provision node history {first}\n"
        f"      a laptop on the LAN   ip netns exec rigbase-lab-client bash\n"
        f"      status / tear down    provision lab status | provision lab down --yes"
    )
    if any(_is_device(n) for n in report["nodes"]):
        print('      devices               provision device status (docs/devices.md, "In the lab")')


@app.command("status")
def status(json_out: Json = False) -> None:
    """Namespaces, processes and nodes of the lab."""
    from provisioner.lab import lifecycle

    report = _run(lifecycle.status)
    if json_out:
        render.print_json(report)
        return
    if not report["up"]:
        owner = report["owner"]
        down = f"RIGBASE_HOME={owner} provision lab down --yes" if owner else "provision lab down --yes"
        leftovers = (
            f" (namespaces of {f'the lab of {owner}' if owner else 'a lab'}: "
            f"{', '.join(report['namespaces'])}; `{down}` removes them)"
            if report["namespaces"]
            else ""
        )
        print(f"no lab in {report['home']}{leftovers}")
        return
    reach = "reachable" if report["control_plane_reachable"] else "NOT reachable"
    hosts = report.get("control_planes", 1)
    shape = f", {hosts} hosts behind HAProxy" if hosts > 1 else ""
    print(f"control plane {report['host_url']} (LAN {report['lan_url']}{shape}): {reach}\n")
    render.table(report["namespaces"], NS_COLUMNS, as_json=False)
    print()
    render.table(report["processes"], PROC_COLUMNS, as_json=False)
    print()
    _show_nodes(report["nodes"])


@app.command("notebook-image")
def notebook_image(json_out: Json = False) -> None:
    """Build the lab's notebook image (JupyterLab over the lab's job image; no registry is reachable from
    the lab) and print its name, for a notebook job's `environment.image` (docs/job-urls.md)."""
    from provisioner.lab import lifecycle

    image, image_id, built = _run(lifecycle.ensure_notebook_image, progress=_progress)
    if json_out:
        render.print_json({"image": image, "id": image_id, "built": built})
        return
    print(image)


@app.command("down")
def down(yes: Yes = False, json_out: Json = False) -> None:
    """Remove every namespace, process and file the lab made (the cached Debian root is kept)."""
    from provisioner.cli.settings import settings
    from provisioner.lab import lifecycle

    home = settings().ensure_home()
    confirm(f"tear down the lab in {home}?", yes)
    removed = _run(lifecycle.down, progress=_progress, home=home)
    if json_out:
        render.print_json(removed)
