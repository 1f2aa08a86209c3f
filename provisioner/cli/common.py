"""What every command group shares: the options (--json, --yes, --wait, --region …), the error
type that prints one line on stderr with the right exit code, and confirmation. A new command group
is a module with `app = group("…")` plus one `add_typer` line in provisioner/cli/main.py."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import IO, Annotated, Any, NoReturn

import typer

EXIT_REFUSED = 1  # refused by a rule, not found, server or connection error
EXIT_USAGE = 2  # malformed input (the same code click uses for usage errors)

Json = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of a table.")]
Yes = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]
Wait = Annotated[bool, typer.Option("--wait", help="Wait, showing progress, until the state change completes.")]
Timeout = Annotated[float, typer.Option("--timeout", help="Seconds --wait waits before giving up.", min=1)]
RegionOpt = Annotated[str | None, typer.Option("--region", "-r", help="Region (needed only when a name is used in several regions).")]


# Typer vendors click in recent releases: take ClickException from Typer's own class tree, so
# Typer's runner prints it (via .show) and exits with .exit_code instead of a traceback.
_ClickException: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


class CliError(_ClickException):  # type: ignore[misc, valid-type]
    """Shown as one line `error: …` on stderr; exit 1 (refused) or 2 (malformed input)."""

    def __init__(self, message: str, *, code: str = "error", exit_code: int = EXIT_REFUSED) -> None:
        super().__init__(" ".join(message.split()))
        self.code = code
        self.exit_code = exit_code

    def show(self, file: IO[Any] | None = None) -> None:
        print(f"error: {self.message}", file=file or sys.stderr)


def fail(message: str, *, exit_code: int = EXIT_REFUSED) -> NoReturn:
    raise CliError(message, exit_code=exit_code)


def group(help_text: str) -> typer.Typer:
    return typer.Typer(help=help_text, no_args_is_help=True, add_completion=False, rich_markup_mode=None)


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
    from provisioner.cli import render
    from provisioner.cli.client import Client

    render.detail(Client.from_env().get(path, **params), as_json=as_json, fields=fields)


def remove_one(question: str, path: str, *, yes: bool, as_json: bool, fields: Sequence[str] | None = None,
               **params: Any) -> None:
    """`remove NAME`: confirm, DELETE, print what the server answered (the row, now `removed`)."""
    from provisioner.cli import render
    from provisioner.cli.client import Client

    confirm(question, yes)
    render.detail(Client.from_env().delete(path, **params), as_json=as_json, fields=fields)
