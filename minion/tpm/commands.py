"""`minion id [--tcti STR] [--json]`: print this node's minion_id (what the operator types into
`provision node add --minion-id`)."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from minion.settings import TCTI_ENV

Tcti = Annotated[
    str | None,
    typer.Option(
        "--tcti",
        envvar=TCTI_ENV,
        help="tpm2-tss TCTI string, e.g. 'swtpm:path=/run/swtpm.sock' (default: device:/dev/tpmrm0).",
    ),
]
JsonFlag = Annotated[bool, typer.Option("--json", help='Print {"minion_id": …, "tcti": …}.')]


def id_command(tcti: Tcti = None, json_output: JsonFlag = False) -> None:
    """Print the minion_id derived from this TPM's endorsement key."""
    from minion.tpm.errors import TpmUnavailable
    from minion.tpm.identity import minion_id
    from minion.tpm.tcti import resolve_tcti

    chosen = resolve_tcti(tcti)
    try:
        value = minion_id(chosen)
    except TpmUnavailable as exc:
        print(f"minion: {exc}", file=sys.stderr)
        raise typer.Exit(1) from None
    print(json.dumps({"minion_id": value, "tcti": chosen}) if json_output else value)


def register(app: typer.Typer) -> None:
    app.command("id")(id_command)
