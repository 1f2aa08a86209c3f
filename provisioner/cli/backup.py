"""`provision backup` and `provision restore`: the control plane's store and key material in one file,
encrypted with a passphrase (services/common/backup.py, docs/control-plane.md "Backups"). They work on
the files under RIGBASE_HOME, not through the API, like `serve`."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from provisioner.cli import render
from provisioner.cli.common import EXIT_USAGE, CliError, Json, read_input

if TYPE_CHECKING:
    from provisioner.services.common.backup import BackupSummary
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


def _run(
    service: Callable[[Settings, Path, str], BackupSummary],
    path: Path,
    passphrase_file: Path | None,
    database: str | None,
    *,
    confirm: bool,
) -> tuple[Settings, BackupSummary]:
    """Load the settings, then ask for the passphrase and run `service` (services.backup's backup or
    restore) on `path`. Errors are one line: bad settings and a Conflict (restore into a home that is not
    empty) refuse (exit 1); any other error of the service is bad input (exit 2)."""
    from contracts.errors import Conflict, RigbaseError
    from provisioner.settings import Settings

    try:
        settings = Settings.load(database_url=database)
    except RigbaseError as exc:
        raise CliError(exc.message) from exc
    try:
        return settings, service(settings, path, _passphrase(passphrase_file, confirm=confirm))
    except Conflict as exc:
        raise CliError(exc.message) from exc
    except RigbaseError as exc:
        raise CliError(exc.message, exit_code=EXIT_USAGE) from exc


def backup(
    output: Annotated[
        Path, typer.Option("--output", "-o", dir_okay=False, help="Backup file to write (0600).")
    ],
    passphrase_file: PassphraseFile = None,
    database: Database = None,
    json_out: Json = False,
) -> None:
    """Back up the store (SQLite) and the key material of RIGBASE_HOME into one encrypted file."""
    from provisioner.services.common import backup as service

    _, summary = _run(service.backup, output, passphrase_file, database, confirm=True)
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
    from provisioner.services.common import backup as service

    settings, summary = _run(service.restore, source, passphrase_file, database, confirm=False)
    out = {"home": str(settings.home), "members": summary.members, "store": summary.store}
    if json_out:
        render.print_json(out)
    else:
        print(settings.home)
