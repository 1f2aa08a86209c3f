"""`minion id [--tcti STR] [--json] [--qr]`: print this node's minion_id (what the operator types into
`provision node add --minion-id`, or scans from a device's sticker: `--qr`)."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from minion.settings import TCTI_ENV
from minion.sticker import qr_text

Tcti = Annotated[
    str | None,
    typer.Option(
        "--tcti",
        envvar=TCTI_ENV,
        help="tpm2-tss TCTI string, e.g. 'swtpm:path=/run/swtpm.sock' (default: device:/dev/tpmrm0).",
    ),
]
JsonFlag = Annotated[bool, typer.Option("--json", help='Print {"minion_id": …, "tcti": …}.')]
QrFlag = Annotated[
    bool,
    typer.Option("--qr", help="Also print the minion_id as a QR code in text, for a sticker printer."),
]


def id_command(tcti: Tcti = None, json_output: JsonFlag = False, qr: QrFlag = False) -> None:
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
    try:
        sticker = qr_text(value) if qr else None
    except ImportError:
        print("minion: --qr needs the segno package: pip install segno, or leave out --qr", file=sys.stderr)
        raise typer.Exit(1) from None
    if json_output:
        answer = {"minion_id": value, "tcti": chosen} | ({"qr": sticker} if sticker else {})
        print(json.dumps(answer))
        return
    print(value)
    if sticker:
        print(sticker, end="")


def register(app: typer.Typer) -> None:
    app.command("id")(id_command)
