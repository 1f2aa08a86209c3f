"""What every command group shares: the options (--json, --yes, --wait, --region …), the error type
that prints one line on stderr with the right exit code (provisioner/cli/errors.py, re-exported here;
each group turns the HTTP client's errors into it), confirmation, and show/remove of one resource. A new
command group is a module with `app = group("…")` plus one `add_typer` line in provisioner/cli/main.py."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from provisioner.cli import render
from provisioner.cli.errors import EXIT_REFUSED, EXIT_USAGE, CliError, fail, from_refusal
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
]

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


class _ClientErrorsAsOneLine(TyperGroup):
    """A command group whose commands' ControlPlaneErrors (the client's, provisioner/client/errors.py)
    print as one line with the right exit code, like every other refusal of the CLI."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except ControlPlaneError as exc:
            raise from_refusal(exc) from exc


def group(help_text: str) -> typer.Typer:
    return typer.Typer(
        help=help_text,
        no_args_is_help=True,
        add_completion=False,
        rich_markup_mode=None,
        cls=_ClientErrorsAsOneLine,
    )


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
    question: str, path: str, *, yes: bool, as_json: bool, fields: Sequence[str] | None = None, **params: Any
) -> None:
    """`remove NAME`: confirm, DELETE, print what the server answered (the row, now `removed`)."""
    confirm(question, yes)
    render.detail(connect().delete(path, **params), as_json=as_json, fields=fields)
