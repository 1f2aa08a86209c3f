"""`provision backup` and `provision restore`: the control plane's store and key material in one file,
encrypted with a passphrase (provisioner/services/backup.py, docs/control-plane.md "Backups"). They work on
the files under RIGBASE_HOME, not through the API, like `serve`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from provisioner.cli import render
from provisioner.cli.common import EXIT_USAGE, CliError, Json, read_input
from provisioner.settings import Settings

PASSPHRASE_ENV = "RIGBASE_BACKUP_PASSPHRASE"
PassphraseFile = Annotated[
    Path | None,
    typer.Option(
        "--passphrase-file",
        dir_okay=False,
        help=f"File whose first line is the passphrase (else ${PASSPHRASE_ENV}, else asked).",
    ),
]
Database = Annotated[
    str | None,
    typer.Option(
        "--database", help="Database URL (default: RIGBASE_DATABASE_URL or SQLite under RIGBASE_HOME)."
    ),
]


def _passphrase(file: Path | None, *, confirm: bool) -> str:
    if file is not None:
        lines = read_input(file, "a file with the passphrase").splitlines()  # `-`: stdin
        return lines[0] if lines else ""
    if os.environ.get(PASSPHRASE_ENV):
        return os.environ[PASSPHRASE_ENV]
    return str(typer.prompt("backup passphrase", hide_input=True, confirmation_prompt=confirm))


def _settings(database: str | None) -> Settings:
    from contracts.errors import RigbaseError

    try:
        return Settings.load(database_url=database)
    except RigbaseError as exc:
        raise CliError(exc.message) from exc


def backup(
    output: Annotated[
        Path, typer.Option("--output", "-o", dir_okay=False, help="Backup file to write (0600).")
    ],
    passphrase_file: PassphraseFile = None,
    database: Database = None,
    json_out: Json = False,
) -> None:
    """Back up the store (SQLite) and the key material of RIGBASE_HOME into one encrypted file."""
    from contracts.errors import RigbaseError
    from provisioner.services import backup as service

    settings = _settings(database)
    try:
        summary = service.backup(settings, output, _passphrase(passphrase_file, confirm=True))
    except RigbaseError as exc:
        raise CliError(exc.message, exit_code=EXIT_USAGE) from exc
    out = {
        "path": str(summary.path),
        "members": summary.members,
        "store": summary.store,
        "bytes": summary.size,
    }
    if json_out:
        render.print_json(out)
        return
    print(summary.path)
    if summary.store == "postgresql":
        print("note: the store is PostgreSQL: back it up with pg_dump (docs/control-plane.md, Backups)")


def restore(
    source: Annotated[Path, typer.Argument(dir_okay=False, help="A file made by `provision backup`.")],
    passphrase_file: PassphraseFile = None,
    database: Database = None,
    json_out: Json = False,
) -> None:
    """Restore a backup into an empty RIGBASE_HOME; then start `provision serve` as before."""
    from contracts.errors import Conflict, RigbaseError
    from provisioner.services import backup as service

    settings = _settings(database)
    try:
        summary = service.restore(settings, source, _passphrase(passphrase_file, confirm=False))
    except Conflict as exc:
        raise CliError(exc.message) from exc
    except RigbaseError as exc:
        raise CliError(exc.message, exit_code=EXIT_USAGE) from exc
    out = {"home": str(settings.home), "members": summary.members, "store": summary.store}
    if json_out:
        render.print_json(out)
    else:
        print(settings.home)
