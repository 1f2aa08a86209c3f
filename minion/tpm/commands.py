"""`minion id [--tcti STR] [--json] [--qr]`: print this node's minion_id (what the operator types into
`provision node add --minion-id`, or scans from a device's sticker: `--qr`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from minion.settings import DEVICE_KEY_ENV, TCTI_ENV
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


DeviceKeyFlag = Annotated[
    bool,
    typer.Option(
        "--device-key",
        envvar=DEVICE_KEY_ENV,
        help="A device without a TPM (Jetson Xavier): prove this device with the key kept in the state "
        "dir (created on first use) instead of a TPM. Only regions that allow it accept it.",
    ),
]
StateOpt = Annotated[
    Path | None,
    typer.Option("--state-dir", file_okay=False, help="With --device-key: where the key lives."),
]


def id_command(
    ctx: typer.Context,
    tcti: Tcti = None,
    json_output: JsonFlag = False,
    qr: QrFlag = False,
    device_key: DeviceKeyFlag = False,
    state_dir: StateOpt = None,
) -> None:
    """Print the minion_id derived from this TPM's endorsement key (or, with --device-key, from the
    device key of a device without a TPM)."""
    from minion.tpm.errors import TpmUnavailable

    chosen: str | None
    try:
        if device_key:
            from minion.device_key import DeviceKey
            from minion.settings import MinionSettings

            key = DeviceKey.load_or_create(state_dir or MinionSettings.of(ctx).state_dir)
            value, chosen, source = key.minion_id, None, str(key.path)
        else:
            from minion.tpm.identity import minion_id
            from minion.tpm.tcti import resolve_tcti

            chosen = resolve_tcti(tcti)
            value, source = minion_id(chosen), "tpm"
    except (TpmUnavailable, RuntimeError, OSError) as exc:
        print(f"minion: {exc}", file=sys.stderr)
        raise typer.Exit(1) from None
    try:
        sticker = qr_text(value) if qr else None
    except ImportError:
        print("minion: --qr needs the segno package: pip install segno, or leave out --qr", file=sys.stderr)
        raise typer.Exit(1) from None
    if json_output:
        answer = {"minion_id": value, "tcti": chosen, "source": source} | ({"qr": sticker} if sticker else {})
        print(json.dumps(answer))
        return
    print(value)
    if sticker:
        print(sticker, end="")


def register(app: typer.Typer) -> None:
    app.command("id")(id_command)
