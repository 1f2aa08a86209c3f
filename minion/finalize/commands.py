"""`minion finalize apply-saved` (the boot unit: apply the last finalize configuration again, offline) and
`minion finalize apply WORK BUNDLE` (debugging: run one work with a bundle file, events as JSON lines).
Exit codes: 0 applied (or nothing saved), 1 the play failed, 2 usage error."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from contracts.finalize import FinalizeEvent, FinalizeWork
from minion.settings import MinionSettings

app = typer.Typer(
    help="On-node finalize: the saved configuration, and single runs for debugging.",
    no_args_is_help=True,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)

StateOpt = Annotated[
    Path | None,
    typer.Option(
        "--state-dir",
        file_okay=False,
        help="The minion's state directory, as for `minion run` (default $RIGBASE_STATE_DIR, else "
        "/var/lib/rigbase/minion).",
    ),
]

HostRoot = Annotated[
    Path | None,
    typer.Option(
        "--host-root",
        file_okay=False,
        exists=True,
        help="A lab node's root: run the play in a chroot of it (rigbase_lab=true), as `minion run "
        "--host-root` does.",
    ),
]


def _emit(event: FinalizeEvent) -> None:
    print(event.model_dump_json(exclude_none=True), flush=True)


def _run(
    work: FinalizeWork,
    bundle: bytes,
    ctx: typer.Context,
    state_dir: Path | None,
    host_root: Path | None,
    skip_tags: str | None = None,
) -> None:
    from minion.finalize.apply import apply_work
    from minion.finalize.paths import FinalizePaths
    from minion.finalize.process import RunBusy

    settings = MinionSettings.of(ctx)
    paths = FinalizePaths(state_dir or settings.state_dir)
    try:
        result = apply_work(
            work,
            bundle,
            paths,
            host_root=host_root,
            collections=settings.ansible_collections,
            on_event=_emit,
            skip_tags=skip_tags,
        )
    except RunBusy as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise typer.Exit(1) from None
    print(result.outcome.model_dump_json(), flush=True)
    if not result.outcome.ok:
        said = result.outcome.message or "-"
        where = f"at task {result.outcome.failed_task!r}: " if result.outcome.failed_task else ""
        print(f"error: finalize failed {where}{said}", file=sys.stderr)
        raise typer.Exit(1)


@app.command("apply-saved")
def apply_saved_command(ctx: typer.Context, state_dir: StateOpt = None, host_root: HostRoot = None) -> None:
    """Apply the last finalize configuration this node applied successfully again (at boot, before the
    minion joins: the root is read-only and what finalize wrote under /etc is gone), without the tasks
    whose work is on the drives (runner.BOOT_SKIP_TAGS). Nothing saved: exit 0."""
    from minion.finalize import saved
    from minion.finalize.paths import FinalizePaths
    from minion.finalize.runner import BOOT_SKIP_TAGS

    paths = FinalizePaths(state_dir or MinionSettings.of(ctx).state_dir)
    found = saved.load(paths)
    if found is None:
        print(f"no saved finalize configuration in {paths.root}: nothing to apply")
        return
    work, bundle = found
    _run(work, bundle, ctx, state_dir, host_root, skip_tags=BOOT_SKIP_TAGS)


@app.command("apply")
def apply_command(
    ctx: typer.Context,
    work_file: Annotated[Path, typer.Argument(dir_okay=False, help="A FinalizeWork as JSON.")],
    bundle_file: Annotated[Path, typer.Argument(dir_okay=False, help="The playbook bundle (.tgz).")],
    state_dir: StateOpt = None,
    host_root: HostRoot = None,
) -> None:
    """Run one finalize work with a bundle file, as the agent would (debugging); saved when it succeeds."""
    from pydantic import ValidationError

    try:
        work = FinalizeWork.model_validate(json.loads(work_file.read_text()))
        bundle = bundle_file.read_bytes()
    except (OSError, ValueError, ValidationError) as exc:
        print(
            f"error: cannot read the work or the bundle ({exc}); give a FinalizeWork JSON file",
            file=sys.stderr,
        )
        raise typer.Exit(2) from None
    _run(work, bundle, ctx, state_dir, host_root)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="finalize")
