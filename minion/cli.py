"""`minion` command line.

Each command group lives in its own module that exposes `register(app)`; adding one is a single line in
COMMAND_MODULES. Those modules import their heavy dependencies (pyudev, tpm2-pytss, zeroconf) inside the
command functions, so `minion --help` stays instant.
Exit codes: 0 ok, 1 refused / requirement failed / not found, 2 usage error, printed as one line like
every other error (OneLineUsage). The environment is read once per command, here (MinionSettings,
minion/settings.py), and passed down. `-h` is --help; `--version` and shell completion as in `provision`.
"""

from __future__ import annotations

import importlib
import sys
from importlib import metadata
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from minion.settings import MinionSettings

COMMAND_MODULES: tuple[str, ...] = (
    "minion.hardware.commands",  # minion inventory, minion check
    "minion.tpm.commands",  # minion id
    "minion.banner",  # minion banner
    "minion.join.commands",  # minion join, minion run
    "minion.finalize.commands",  # minion finalize apply-saved, minion finalize apply
    "minion.gce_commands",  # minion gce-bundle
    "minion.gpu.commands",  # minion gpu cdi
)

EXIT_USAGE = 2
# Typer vendors click: its UsageError is the parent of typer.BadParameter
_UsageError: type[Exception] = typer.BadParameter.__mro__[1]


def _usage_line(exc: Exception) -> str:
    """click's usage block (usage, hint, message) as one line naming the --help to read."""
    ctx = getattr(exc, "ctx", None)
    where = ctx.command_path if ctx is not None else "minion"
    message = " ".join(exc.format_message().split()).rstrip(".")  # type: ignore[attr-defined]
    return f"error: {message}: see `{where} --help`"


class OneLineUsage(TyperGroup):
    """Usage errors (a missing option, an unknown command) as one line on stderr, exit 2."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        standalone = kwargs.pop("standalone_mode", True)
        try:
            kwargs["standalone_mode"] = False  # an Exit answers its code instead of exiting
            code = super().main(*args, **kwargs)
            if not standalone:
                return code
            sys.exit(code if isinstance(code, int) else 0)
        except _UsageError as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # `minion` alone: the help
                exc.show()  # type: ignore[attr-defined]
            else:
                print(_usage_line(exc), file=sys.stderr)
            sys.exit(EXIT_USAGE)
        except typer.Exit as exc:
            sys.exit(exc.exit_code)
        except typer.Abort:
            print("error: interrupted", file=sys.stderr)
            sys.exit(1)
        except Exception as exc:
            show = getattr(exc, "show", None)  # another ClickException: its own message and code
            if show is None:
                raise
            show()
            sys.exit(getattr(exc, "exit_code", 1))


app = typer.Typer(
    help="rigbase minion: the agent on each GPU node.",
    no_args_is_help=True,
    rich_markup_mode=None,  # plain help, as `provision` and `image-builder` print it
    pretty_exceptions_enable=False,
    cls=OneLineUsage,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        try:
            print(f"minion: {metadata.version('rigbase')}")
        except metadata.PackageNotFoundError:
            print("minion: unknown (not installed)")
        raise typer.Exit()


@app.callback()
def _load_settings(
    ctx: typer.Context,
    version: Annotated[
        bool, typer.Option("--version", is_eager=True, callback=_version, help="Print minion's version.")
    ] = False,
) -> None:
    """rigbase minion: the agent on each GPU node."""
    try:
        ctx.obj = MinionSettings.from_env()
    except ValueError as exc:  # a RIGBASE_* variable with a value it cannot take: one line, exit 2
        raise typer.BadParameter(str(exc)) from None


for _module in COMMAND_MODULES:
    importlib.import_module(_module).register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
