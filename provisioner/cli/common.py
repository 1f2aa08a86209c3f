"""What every command group shares: the options (--json, --yes, --wait, --region …), the error type
that prints one line on stderr with the right exit code (provisioner/cli/errors.py, re-exported here;
each group turns the HTTP client's errors into it), confirmation, and show/remove of one resource. A new
command group is a module with `app = group("…")` plus one line in GROUPS in provisioner/cli/main.py.

Every list and show gets `-o table|wide|json|yaml` and `--watch` with ONE decorator, `@output_options`
(under `@app.command`); a file argument reads stdin when it is `-` through `read_input`."""

from __future__ import annotations

import functools
import inspect
import io
import stat
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import redirect_stdout
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar, get_type_hints

import typer
from typer.core import TyperGroup

from provisioner.cli import render
from provisioner.cli.errors import EXIT_REFUSED, EXIT_USAGE, CliError, fail, from_refusal, usage_line
from provisioner.cli.settings import connect
from provisioner.client import ControlPlaneError

__all__ = [
    "EXIT_REFUSED",
    "EXIT_USAGE",
    "CliError",
    "fail",
    "from_refusal",
    "group",
    "confirm",
    "show_one",
    "remove_one",
    "output_options",
    "read_input",
    "HELP_OPTIONS",
]

HELP_OPTIONS = {"help_option_names": ["-h", "--help"]}
WATCH_EVERY_S = 2.0
F = TypeVar("F", bound=Callable[..., Any])

Json = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of a table.")]
Yes = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]
Wait = Annotated[
    bool, typer.Option("--wait", help="Wait, showing progress, until the state change completes.")
]
Timeout = Annotated[float, typer.Option("--timeout", help="Seconds --wait waits before giving up.", min=1)]
RegionOpt = Annotated[
    str | None,
    typer.Option("--region", "-r", help="Region (needed only when a name is used in several regions)."),
]


# Typer vendors click: its UsageError is the parent of typer.BadParameter
_UsageError: type[Exception] = typer.BadParameter.__mro__[1]


def _one_line(exc: Exception) -> CliError:
    return CliError(usage_line(exc, "provision"), exit_code=EXIT_USAGE)


class OneLineErrors(TyperGroup):
    """A command group whose errors print as one line with the right exit code, like every other refusal
    of the CLI: the client's ControlPlaneErrors (provisioner/client/errors.py), and click's usage errors
    (a missing option, an unknown command) instead of click's usage block. `provision` and each group."""

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any) -> Any:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except _UsageError as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # `provision node` alone: its help
                raise
            raise _one_line(exc) from exc

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except ControlPlaneError as exc:
            raise from_refusal(exc) from exc
        except _UsageError as exc:  # a subcommand's own arguments did not parse
            if type(exc).__name__ == "NoArgsIsHelpError":
                raise
            raise _one_line(exc) from exc


def group(help_text: str) -> typer.Typer:
    return typer.Typer(
        help=help_text,
        no_args_is_help=True,
        add_completion=False,
        rich_markup_mode=None,
        cls=OneLineErrors,
        context_settings=HELP_OPTIONS,
    )


def read_input(path: Path, what: str, *, called: str = "") -> str:
    """The text of a file argument; `-` reads stdin (`--password-file -`, `tpm-ca add -`). One line of
    error naming the file and what it should hold when it cannot be read."""
    if str(path) == "-":
        return sys.stdin.read()
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not text"
        named = f"{called} {path}" if called else str(path)  # "password file /x": what the flag calls it
        fail(f"cannot read {named} ({why}): pass {what}, or - to read it from stdin", exit_code=EXIT_USAGE)


def read_secret_file(path: Path, what: str, *, called: str) -> str:
    """The first line of a file holding a secret (`-`: stdin). A file that others may read is refused
    with the `chmod` to run: a secret at rest belongs to its owner alone."""
    if str(path) != "-":
        try:
            mode = path.stat().st_mode
        except OSError as exc:
            fail(
                f"cannot read {called} {path} ({exc.strerror}): pass {what}, or - for stdin",
                exit_code=EXIT_USAGE,
            )
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            fail(f"{called} {path} is readable by others: run `chmod 600 {path}` first", exit_code=EXIT_USAGE)
    lines = read_input(path, what, called=called).splitlines()
    if not lines or not lines[0]:
        fail(f"{called} {path} is empty: put the secret on its first line", exit_code=EXIT_USAGE)
    return lines[0]


def _watch(draw: Callable[[], None]) -> None:
    """Redraw every WATCH_EVERY_S until Ctrl-C: in place on a terminal (Rich Live), else one screen
    after another (a log, a pipe). Ctrl-C ends it with exit 0, as kubectl's --watch does."""
    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    def screen() -> str:
        out = io.StringIO()
        with redirect_stdout(out):
            draw()
        stamp = datetime.now(UTC).strftime("%H:%M:%S")
        return f"{out.getvalue().rstrip()}\n(every {WATCH_EVERY_S:.0f} s, last {stamp} UTC; Ctrl-C to stop)"

    con = Console(width=render.FIT_WIDTH * 10)
    try:
        if not con.is_terminal:
            while True:
                print(screen() + "\n", flush=True)
                time.sleep(WATCH_EVERY_S)
        with Live(Text(screen()), console=con, auto_refresh=False) as live:
            while True:
                time.sleep(WATCH_EVERY_S)
                live.update(Text(screen()), refresh=True)
    except KeyboardInterrupt:
        return


def output_options(command: F) -> F:
    """Give a list or show command `-o/--output table|wide|json|yaml`, `--watch/-w` and, unless it has
    one, `--json` (the alias of `-o json`). The command prints with render.table / render.detail as
    usual; this sets the format, and with --watch runs it again every 2 s."""
    params = inspect.signature(command, eval_str=True).parameters
    hints = get_type_hints(command, include_extras=True)
    has_json = "json_out" in params
    extra = {
        "output": inspect.Parameter(
            "output",
            inspect.Parameter.KEYWORD_ONLY,
            default=render.Output.TABLE,
            annotation=Annotated[
                render.Output,
                typer.Option(
                    "--output", "-o", help="table, wide (every column), json or yaml.", case_sensitive=False
                ),
            ],
        ),
        "watch": inspect.Parameter(
            "watch",
            inspect.Parameter.KEYWORD_ONLY,
            default=False,
            annotation=Annotated[bool, typer.Option("--watch", "-w", help="Redraw every 2 s until Ctrl-C.")],
        ),
    }
    if not has_json:
        extra["json_out"] = inspect.Parameter(
            "json_out", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=Json
        )

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        output, watch = kwargs.pop("output"), kwargs.pop("watch")
        as_json = kwargs["json_out"] if has_json else kwargs.pop("json_out")
        render.use(render.Output.JSON if as_json else output)
        if not watch:
            return command(*args, **kwargs)
        _watch(lambda: command(*args, **kwargs))
        return None

    run.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [p.replace(annotation=hints.get(n, p.annotation)) for n, p in params.items()] + list(extra.values())
    )
    run.__annotations__ = {**hints, **{n: p.annotation for n, p in extra.items()}}
    return run  # type: ignore[return-value]


def confirm(question: str, yes: bool) -> None:
    """Ask before destroying something; --yes skips it. Without a terminal there is nobody to ask."""
    if yes:
        return
    if not sys.stdin.isatty():
        fail(f"{question} needs confirmation: pass --yes", exit_code=EXIT_USAGE)
    if not typer.confirm(question, default=False, err=True):
        fail("nothing changed: answer y or pass --yes")


def show_one(path: str, *, as_json: bool, fields: Sequence[str] | None = None, **params: Any) -> None:
    """`show NAME`: GET one resource and print it (every field, or `fields` in that order)."""
    render.detail(connect().get(path, **params), as_json=as_json, fields=fields)


def remove_one(
    question: str,
    path: str,
    *,
    yes: bool,
    as_json: bool,
    fields: Sequence[str] | None = None,
    kind: str | None = None,
    verb: str = "removed",
    **params: Any,
) -> None:
    """`remove NAME`: confirm, DELETE, and say it in one line (`-o json|yaml`: the row the server
    answered, now `removed`)."""
    confirm(question, yes)
    row = connect().delete(path, **params)
    if render.machine(row, render.chosen(as_json)) or not isinstance(row, dict):
        return
    kind = kind or path.strip("/").split("/")[1].removesuffix("s").replace("-", " ")  # /v1/nodes/x: node
    name, state = row.get("name") or row.get("registry") or "", row.get("state")
    done = state or verb  # a region a provider still tears down says `removing`
    print(f"{kind} '{name}' {done}" + (f" ({row['id']})" if row.get("id") else ""))
