"""`provision lab …`: the local lab (a region of simulated nodes on this machine; docs/lab.md)."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from provisioner.cli import render
from provisioner.cli.common import EXIT_USAGE, CliError, Json, Yes, confirm, fail, group

app = group("Local lab: a control plane and simulated nodes (swtpm, umockdev, network namespaces) on this machine.")
NODE_COLUMNS = [("name", "NODE"), ("minion_id", "MINION ID"), ("state", "STATE"), ("online", "ONLINE"),
                ("netns", "NAMESPACE"), ("address", "ADDRESS"), ("join_seconds", "JOIN S"), ("reason", "REASON")]
NS_COLUMNS = [("name", "NAMESPACE"), ("address", "ADDRESS"), ("exists", "EXISTS")]
PROC_COLUMNS = [("kind", "PROCESS"), ("node", "NODE"), ("pid", "PID"), ("alive", "ALIVE")]


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _run(fn: Any, *args: Any, **kwargs: Any) -> Any:
    from provisioner.errors import InvalidInput, RigbaseError

    try:
        return fn(*args, **kwargs)
    except InvalidInput as exc:
        raise CliError(exc.message, exit_code=EXIT_USAGE) from exc
    except RigbaseError as exc:
        raise CliError(exc.message) from exc


def _show_nodes(nodes: list[dict[str, Any]]) -> None:
    render.table(nodes, NODE_COLUMNS, as_json=False, empty="no lab node yet")


@app.command("up")
def up(
    nodes: Annotated[int, typer.Option("--nodes", "-n", help="How many simulated nodes (1-16).")] = 2,
    upnp: Annotated[bool, typer.Option("--upnp", help="Also a router (miniupnpd) and a WAN namespace.")] = False,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait for the nodes to reach maintenance.", min=1)] = 600,
    json_out: Json = False,
) -> None:
    """Start the lab (or finish starting it): control plane, region `lab`, N nodes joined and in maintenance."""
    from provisioner.lab import lab
    from provisioner.lab.topology import LabPlan

    try:
        plan = LabPlan(nodes=nodes, upnp=upnp)
    except ValueError as exc:
        fail(str(exc), exit_code=EXIT_USAGE)
    _run(lab.up, plan, progress=_progress, timeout=timeout)
    report = _run(lab.status)
    if json_out:
        render.print_json(report)
        return
    _show_nodes(report["nodes"])
    first = report["nodes"][0]["name"] if report["nodes"] else "node-1"
    print(f"\nThe lab is up. Plain `provision …` commands in this RIGBASE_HOME ({report['home']}) use its control plane.\n"
          f"Next: activate a node       provision node maintenance {first} off\n"
          f"      see its history       provision node history {first}\n"
          f"      a laptop on the LAN   ip netns exec rigbase-lab-client bash\n"
          f"      status / tear down    provision lab status | provision lab down --yes")


@app.command("status")
def status(json_out: Json = False) -> None:
    """Namespaces, processes and nodes of the lab."""
    from provisioner.lab import lab

    report = _run(lab.status)
    if json_out:
        render.print_json(report)
        return
    if not report["up"]:
        print(f"no lab in {report['home']}" + (f" (leftover namespaces: {', '.join(report['namespaces'])}; "
                                               "`provision lab down --yes` removes them)" if report["namespaces"] else ""))
        return
    reach = "reachable" if report["control_plane_reachable"] else "NOT reachable"
    print(f"control plane {report['host_url']} (LAN {report['lan_url']}): {reach}\n")
    render.table(report["namespaces"], NS_COLUMNS, as_json=False)
    print()
    render.table(report["processes"], PROC_COLUMNS, as_json=False)
    print()
    _show_nodes(report["nodes"])


@app.command("down")
def down(yes: Yes = False, json_out: Json = False) -> None:
    """Remove every namespace, process and file the lab made (the cached Debian root is kept)."""
    from provisioner.config import rigbase_home
    from provisioner.lab import lab

    confirm(f"tear down the lab in {rigbase_home()}?", yes)
    removed = _run(lab.down, progress=_progress)
    if json_out:
        render.print_json(removed)
