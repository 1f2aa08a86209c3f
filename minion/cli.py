"""`minion` command line.

Each command group lives in its own module that exposes `register(app)`; adding one is a single line in
COMMAND_MODULES. Those modules import their heavy dependencies (pyudev, tpm2-pytss, zeroconf) inside the
command functions, so `minion --help` stays instant.
Exit codes: 0 ok, 1 refused / requirement failed / not found, 2 usage error (Click's own).
The environment is read once per command, here (MinionSettings, minion/settings.py), and passed down.
"""

from __future__ import annotations

import importlib

import typer

from minion.settings import MinionSettings

COMMAND_MODULES: tuple[str, ...] = (
    "minion.hardware.commands",  # minion inventory, minion check
    "minion.tpm.commands",  # minion id
    "minion.banner",  # minion banner
    "minion.join.commands",  # minion join, minion run
)

app = typer.Typer(
    help="rigbase minion: the agent on each GPU node.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _load_settings(ctx: typer.Context) -> None:
    """rigbase minion: the agent on each GPU node."""
    ctx.obj = MinionSettings.from_env()


for _module in COMMAND_MODULES:
    importlib.import_module(_module).register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
