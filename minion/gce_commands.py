"""`minion gce-bundle`: copy the enrollment bundle from the GCE metadata server to a file (the GCE image's
rigbase-gce-bundle.service runs it before the minion; docs/gcp.md "The rigbase image on GCE")."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from minion.settings import MinionSettings


def gce_bundle_command(
    ctx: typer.Context,
    output: Annotated[
        Path, typer.Option("--output", "-o", dir_okay=False, help="Where to write the bundle (mode 0600).")
    ],
    wait: Annotated[
        float,
        typer.Option(
            "--wait", min=0, help="Seconds to keep retrying while the metadata server is unreachable."
        ),
    ] = 300.0,
    json_output: Annotated[bool, typer.Option("--json", help="Print the outcome as JSON.")] = False,
) -> None:
    """Read this VM's enrollment bundle from the GCE metadata server and write it to --output."""
    from minion.gce_metadata import MetadataUnavailable, NoBundle, fetch_to

    host = MinionSettings.of(ctx).gce_metadata_host
    try:
        bundle = fetch_to(output, host, wait_s=wait, say=lambda m: print(m, file=sys.stderr, flush=True))
    except (MetadataUnavailable, NoBundle) as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise typer.Exit(1) from None
    if json_output:
        print(json.dumps({"output": str(output), "region": bundle.region, "region_id": bundle.region_id}))
    else:
        print(f"bundle of region {bundle.region} written to {output}")


def register(app: typer.Typer) -> None:
    app.command("gce-bundle")(gce_bundle_command)
