"""What every `image-builder` command shares: the one-line error with its exit code, the command group
that prints usage errors as one line too, and the output (Rich for people, JSON for machines).

The conventions are those of the control plane's `provision` (docs/image-builder.md, "Command line"):
`--json` puts machine output on stdout, exit 0 ok / 1 refused or failed / 2 usage, an error is one line
on stderr that says what to do next. The image builder is its own program and imports nothing of the
provisioner, so the few helpers it needs live here."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import IO, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperGroup

EXIT_REFUSED = 1  # refused by a rule, a missing or malformed input, a failed build step
EXIT_USAGE = 2  # malformed command line (the code click uses for usage errors)

# Typer vendors click: take its exception classes from Typer's own class tree (typer.BadParameter is a
# UsageError, which is a ClickException), so the runner recognises ours.
_UsageError: type[Exception] = typer.BadParameter.__mro__[1]
_ClickException: type[Exception] = next(
    c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException"
)


class CommandError(_ClickException):  # type: ignore[misc, valid-type]
    """Shown as one line `error: …` on stderr; exit 1 (refused) or 2 (malformed input)."""

    def __init__(self, message: str, *, exit_code: int = EXIT_REFUSED) -> None:
        super().__init__(" ".join(message.split()))
        self.exit_code = exit_code

    def show(self, file: IO[Any] | None = None) -> None:
        print(f"error: {self.message}", file=file or sys.stderr)


def fail(message: str, *, exit_code: int = EXIT_REFUSED) -> NoReturn:
    raise CommandError(message, exit_code=exit_code)


def _usage_line(exc: Exception) -> str:
    """click's usage error (usage, hint, message on three lines) as one line naming the --help to read."""
    ctx = getattr(exc, "ctx", None)
    where = ctx.command_path if ctx is not None else "image-builder"
    message = " ".join(exc.format_message().split())  # type: ignore[attr-defined]
    return f"error: {message.rstrip('.')}: see `{where} --help`"


class UsageErrorsOnOneLine(TyperGroup):
    """The command group whose usage errors are one line on stderr (exit 2), like every other error."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        try:
            code = super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
        except _UsageError as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # `image-builder` alone: the help, exit 2
                exc.show()  # type: ignore[attr-defined]
            else:
                print(_usage_line(exc), file=sys.stderr)
            code = EXIT_USAGE
        except _ClickException as exc:
            exc.show()  # type: ignore[attr-defined]
            code = exc.exit_code  # type: ignore[attr-defined]
        except typer.Abort:
            print("error: interrupted: run the command again", file=sys.stderr)
            code = EXIT_REFUSED
        if not standalone_mode:
            return code
        sys.exit(code or 0)


# -- output ------------------------------------------------------------------------------------------------

_WIDTH = 1000  # wide enough that Rich never shortens a digest or a path; tables do not expand


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True, default=str))


def detail(obj: dict[str, Any], *, fields: Sequence[str] | None = None) -> None:
    """One object as `field  value` lines, without the padding Rich adds (output pastes and diffs cleanly)."""
    t = Table(box=None, show_header=False, pad_edge=False)
    t.add_column(style="bold", no_wrap=True)
    t.add_column(no_wrap=True, overflow="ignore")
    for field in fields or list(obj):
        value = obj.get(field)
        t.add_row(field, "-" if value is None else str(value))
    con = Console(width=_WIDTH, soft_wrap=True)
    with con.capture() as captured:
        con.print(t)
    print("\n".join(line.rstrip() for line in captured.get().splitlines()))


@contextmanager
def progress(what: str) -> Iterator[Callable[[str], None]]:
    """A status line on stderr for a long step (a spinner on a terminal); every message is also kept as a
    line above it, so a build log in CI reads the same as on a terminal. stdout stays clean for --json."""
    console = Console(stderr=True)
    with console.status(what) as status:

        def log(message: str) -> None:
            console.print(message, markup=False, highlight=False)
            status.update(message)

        yield log
