"""`minion gpu cdi`: the CDI spec for this node's NVIDIA driver (minion/gpu/cdi.py), printed or written."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

gpu = typer.Typer(
    help="The node's NVIDIA GPUs as containers get them.",
    no_args_is_help=True,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@gpu.command("cdi")
def cdi_command(
    host_root: Annotated[
        Path,
        typer.Option(
            "--host-root",
            help="Where the driver installation is (a mounted node tree); NVML is asked only for /.",
        ),
    ] = Path("/"),
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Write the spec to this file (atomically) instead of stdout."),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="JSON instead of YAML.")] = False,
) -> None:
    """Print the spec `nvidia-ctk cdi generate` would write for this driver (hooks replaced by mounts);
    on a Jetson, the spec of its --mode=csv from L4T's host-files-for-container.d."""
    from minion.gpu import cdi
    from minion.gpu.driver import NoDriver
    from minion.gpu.nvml import driver_view

    try:
        document, _ = cdi.node_spec(host_root, driver_view() if host_root == Path("/") else None)
    except NoDriver as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise typer.Exit(1) from None
    text = json.dumps(document, indent=1) + "\n" if json_out else cdi.render(document)
    if output is None:
        sys.stdout.write(text)
        return
    try:
        cdi.write_atomically(output, text)
    except OSError as exc:
        print(f"error: cannot write {output} ({exc.strerror}): pass a writable path", file=sys.stderr)
        raise typer.Exit(1) from None
    print(output)


@gpu.command("health")
def health_command(
    record: Annotated[
        Path | None,
        typer.Option("--record", help="Also write NVML's raw answers to this file (to replay elsewhere)."),
    ] = None,
    replay: Annotated[
        Path | None, typer.Option("--replay", help="Assess answers recorded with --record instead of NVML.")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="The report as JSON.")] = False,
) -> None:
    """What NVML says of each GPU and what it is fit for: ok (offered), busy, lost or failed (docs)."""
    from minion.gpu.health import NvmlAnswers, PynvmlReader, RecordedReader, assess

    try:
        answers = RecordedReader(replay).read() if replay else PynvmlReader().read()
    except (OSError, ValueError, TypeError) as exc:
        print(f"error: cannot read {replay} ({exc}): pass a file written by --record", file=sys.stderr)
        raise typer.Exit(1) from None
    if record is not None:
        record.write_text(NvmlAnswers.dump(answers))
    report = assess(answers)
    if json_out:
        print(report.model_dump_json(indent=1))
        return
    print(f"driver {report.driver_version or '-'}" + (f": {report.problem}" if report.problem else ""))
    for g in report.gpus:
        facts = f"{g.name or '?'} {g.pci_bus_id or ''} PCIe gen {g.pcie_gen or '?'} x{g.pcie_width or '?'}"
        print(f"GPU {g.index}  {g.state.value:<6}  {facts}" + (f"  {g.reason}" if g.reason else ""))
    if report.problem or any(g.state.value != "ok" for g in report.gpus):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.add_typer(gpu, name="gpu")
