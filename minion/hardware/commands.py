"""`minion inventory` and `minion check`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from contracts.regional import StorageMode
from minion.settings import MinionSettings

if TYPE_CHECKING:
    from minion.hardware.model import Inventory

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

HostRoot = Annotated[
    Path | None,
    typer.Option(
        "--host-root",
        file_okay=False,
        exists=True,
        help="Read /proc files under this directory (as node-feature-discovery's host paths); sysfs "
        "still comes through udev.",
    ),
]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
StorageModeOption = Annotated[
    StorageMode | None,
    typer.Option(
        "--storage-mode",
        case_sensitive=False,
        help="The region's storage mode: local needs 3 SATA drives, central a 10 Gb/s NIC.",
    ),
]
PublicJobsFlag = Annotated[
    bool,
    typer.Option("--public-jobs", help="The region sells spare capacity: memory, lane and core rules apply."),
]
NvmlReplay = Annotated[
    Path | None,
    typer.Option(
        "--nvml-replay",
        dir_okay=False,
        help="NVML's answers recorded on a node (`minion gpu health --record FILE`) in place of this "
        "machine's NVML: a node's GPU facts and rules, checked elsewhere.",
    ),
]
InventoryFile = Annotated[
    Path | None,
    typer.Option(
        "--inventory", dir_okay=False, help="Use a saved `minion inventory --json` instead of this machine."
    ),
]


def fail(message: str, code: int) -> typer.Exit:
    """Print the one-line error and return the Exit to raise."""
    print(f"minion: {message}", file=sys.stderr)
    return typer.Exit(code)


def load_or_collect(
    inventory_file: Path | None,
    host_root: Path | None,
    catalogue_file: Path | None = None,
    nvml_replay: Path | None = None,
) -> Inventory:
    """The saved inventory when one is given, else this machine's (GPU facts from `catalogue_file`,
    MinionSettings.gpu_catalogue, and NVML or its recorded answers). Bad input exits 2, a machine whose
    /proc cannot be read exits 1."""
    from minion.gpu.health import RecordedReader
    from minion.hardware.inventory import collect
    from minion.hardware.model import InvalidInventory, Inventory

    if inventory_file is not None and nvml_replay is not None:
        raise fail("--inventory and --nvml-replay both say what the GPUs are: pass one of them.", EXIT_USAGE)
    reader = None
    if nvml_replay is not None:
        reader = RecordedReader(nvml_replay)
        try:
            reader.read()
        except (OSError, ValueError, TypeError) as exc:
            raise fail(
                f"cannot read {nvml_replay} ({exc}); pass a file written by `minion gpu health --record`.",
                EXIT_USAGE,
            ) from None

    if inventory_file is not None:
        try:
            return Inventory.from_json(inventory_file.read_bytes())
        except OSError as exc:
            raise fail(
                f"cannot read {inventory_file}: {exc.strerror}; pass a file written by "
                "`minion inventory --json`.",
                EXIT_USAGE,
            ) from None
        except InvalidInventory as exc:
            raise fail(f"{inventory_file}: {exc}.", EXIT_USAGE) from None
    try:
        return collect(host_root, catalogue_file, reader)
    except (OSError, ValueError) as exc:
        hint = (
            "point --host-root at a directory holding proc/meminfo and proc/cpuinfo"
            if host_root
            else "is /proc mounted?"
        )
        raise fail(
            f"cannot read the host's /proc files ({exc}); {hint}.", EXIT_USAGE if host_root else EXIT_FAILED
        ) from None


def inventory_command(
    ctx: typer.Context,
    host_root: HostRoot = None,
    nvml_replay: NvmlReplay = None,
    json_output: JsonFlag = False,
) -> None:
    """Show the GPUs, drives, TPM, NICs, memory and CPU this machine has."""
    inventory = load_or_collect(None, host_root, MinionSettings.of(ctx).gpu_catalogue, nvml_replay)
    if json_output:
        print(json.dumps(inventory.to_json(), indent=2))
        return
    from minion.hardware.tables import print_inventory

    print_inventory(inventory)


def check_command(
    ctx: typer.Context,
    storage_mode: StorageModeOption = None,
    public_jobs: PublicJobsFlag = False,
    inventory_file: InventoryFile = None,
    host_root: HostRoot = None,
    nvml_replay: NvmlReplay = None,
    json_output: JsonFlag = False,
) -> None:
    """Check this machine against the hardware requirements. Exit 0 when all pass, 1 when any fails."""
    from minion.hardware.requirements import check

    settings = MinionSettings.of(ctx)
    inventory = load_or_collect(inventory_file, host_root, settings.gpu_catalogue, nvml_replay)
    report = check(inventory, storage_mode, public_jobs)
    if json_output:
        print(json.dumps({**report.to_json(), "inventory": inventory.to_json()}, indent=2))
    else:
        from minion.hardware.tables import print_report

        print_report(report)
    raise typer.Exit(EXIT_OK if report.ok else EXIT_FAILED)


def register(app: typer.Typer) -> None:
    app.command("inventory")(inventory_command)
    app.command("check")(check_command)
