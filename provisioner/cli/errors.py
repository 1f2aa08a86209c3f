"""The CLI's one error type and exit codes: one line `error: …` on stderr, exit 1 (refused) or 2
(malformed input). Below everything else in provisioner/cli/. The HTTP client (provisioner/client/) and the
lab raise RigbaseErrors, which `from_refusal` turns into this."""

from __future__ import annotations

import sys
from typing import IO, Any, NoReturn

import typer

from contracts.errors import InvalidInput, RigbaseError
from provisioner.client.errors import ControlPlaneError

EXIT_REFUSED = 1  # refused by a rule, not found, server or connection error
EXIT_USAGE = 2  # malformed input (the same code click uses for usage errors)


# Typer vendors click in recent releases: take ClickException from Typer's own class tree, so
# Typer's runner prints it (via .show) and exits with .exit_code instead of a traceback.
_ClickException: type[Exception] = next(
    c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException"
)


class CliError(_ClickException):  # type: ignore[misc, valid-type]
    """Shown as one line `error: …` on stderr; exit 1 (refused) or 2 (malformed input)."""

    def __init__(self, message: str, *, code: str = "error", exit_code: int = EXIT_REFUSED) -> None:
        super().__init__(" ".join(message.split()))
        self.code = code
        self.exit_code = exit_code

    def show(self, file: IO[Any] | None = None) -> None:
        print(f"error: {self.message}", file=file or sys.stderr)


def from_refusal(exc: RigbaseError) -> CliError:
    """A refusal of the control plane, its client or the lab as the CLI's error: exit 2 when the input was
    malformed (judged here or by the server), else 1; the machine `code` is kept."""
    malformed = isinstance(exc, InvalidInput) or (isinstance(exc, ControlPlaneError) and exc.malformed_input)
    return CliError(exc.message, code=exc.code, exit_code=EXIT_USAGE if malformed else EXIT_REFUSED)


def usage_line(exc: Exception, program: str) -> str:
    """click's usage error (usage, hint and message on three lines) as one line naming the --help to read."""
    ctx = getattr(exc, "ctx", None)
    where = ctx.command_path if ctx is not None else program
    message = " ".join(exc.format_message().split()).rstrip(".")  # type: ignore[attr-defined]
    return f"{message}: see `{where} --help`"


def fail(message: str, *, exit_code: int = EXIT_REFUSED) -> NoReturn:
    raise CliError(message, exit_code=exit_code)
