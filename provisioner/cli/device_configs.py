"""`provision device-config …`: the inference container a device runs (docs/devices.md, "Configurations").

add, list, show, update (a new revision; devices keep the deployed one until `provision device deploy`),
remove. Keys (--key NAME=VALUE) are third-party credentials: sealed at rest, shown by name only."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from provisioner.cli import render
from provisioner.cli.common import Json, RegionOpt, Yes, confirm, fail, group, output_options
from provisioner.cli.errors import EXIT_USAGE
from provisioner.cli.settings import connect

app = group("Device configurations: the inference container (image, model, command, output) devices run.")

SHOW_FIELDS = (
    "id",
    "name",
    "region",
    "state",
    "revision",
    "image",
    "model",
    "command",
    "checkpoints",
    "datastore",
    "datastore_path",
    "env",
    "keys",
    "created_at",
    "updated_at",
)
COLUMNS: render.Columns = [
    ("id", "ID"),
    ("name", "NAME"),
    ("region", "REGION"),
    ("revision", "REVISION"),
    ("image", "IMAGE"),
    ("model", "MODEL"),
    ("updated_at", "UPDATED", render.ago("updated_at")),
]
WIDE_COLUMNS: render.Columns = [("command", "COMMAND"), ("datastore", "DATASTORE")]

Image = Annotated[str | None, typer.Option("--image", help="Container image (aarch64 for a Jetson).")]
Model = Annotated[
    str | None, typer.Option("--model", help="Model: a directory of the region cache, mounted read-only.")
]
Command = Annotated[str | None, typer.Option("--command", help="What the container runs (/bin/sh -c).")]
Checkpoint = Annotated[
    list[str] | None, typer.Option("--checkpoint", help="A checkpoint of the region cache (repeatable).")
]
DatastoreOpt = Annotated[
    str | None, typer.Option("--datastore", help="Datastore of the region the output goes to.")
]
DatastorePath = Annotated[
    str | None, typer.Option("--datastore-path", help="Path below the datastore's root, mounted as output.")
]
Env = Annotated[list[str] | None, typer.Option("--env", help="K=V environment variable (repeatable).")]
Key = Annotated[
    list[str] | None,
    typer.Option("--key", help="NAME=VALUE third-party credential: sealed, never shown (repeatable)."),
]


def pairs(option: str, values: list[str] | None) -> dict[str, str] | None:
    """K=V options as a mapping; a value without '=' is refused with the form to use."""
    if values is None:
        return None
    out: dict[str, str] = {}
    for value in values:
        name, sep, rest = value.partition("=")
        if not sep or not name:
            fail(
                f"{option} {value.split('=')[0]!r} needs a value: write {option} NAME=VALUE",
                exit_code=EXIT_USAGE,
            )
        out[name] = rest
    return out


def _body(
    image: str | None,
    model: str | None,
    command: str | None,
    checkpoint: list[str] | None,
    datastore: str | None,
    datastore_path: str | None,
    env: list[str] | None,
    key: list[str] | None,
) -> dict[str, Any]:
    return {
        "image": image,
        "model": model,
        "command": command,
        "checkpoints": checkpoint,
        "datastore": datastore,
        "datastore_path": datastore_path,
        "env": pairs("--env", env),
        "keys": pairs("--key", key),
    }


@app.command("add")
def add(
    name: Annotated[str, typer.Argument(help="DNS label, unique among the configurations of its region.")],
    region: Annotated[str, typer.Option("--region", "-r", help="The region of the devices that run it.")],
    image: Image = None,
    model: Model = None,
    command: Command = None,
    checkpoint: Checkpoint = None,
    datastore: DatastoreOpt = None,
    datastore_path: DatastorePath = None,
    env: Env = None,
    key: Key = None,
    json_out: Json = False,
) -> None:
    """Add a configuration (revision 1); prints its id.

    Example: provision device-config add detect --region edge-1 --image registry.lan/detect:1 --model yolo
    --command 'python3 serve.py' --datastore nas --datastore-path /detections --key API_TOKEN=…
    """
    body = {"name": name, "region": region}
    body |= _body(image, model, command, checkpoint, datastore, datastore_path, env, key)
    render.created(connect().post("/v1/device-configs", body), as_json=json_out)


@app.command("list")
@output_options
def list_(
    region: Annotated[str | None, typer.Option("--region", "-r", help="Only this region's.")] = None,
    json_out: Json = False,
) -> None:
    """List configurations (their latest revision), by region then name."""
    rows = render.by_region_then_name(connect().pages("/v1/device-configs", region=region))
    empty = "no device configuration yet: `provision device-config add NAME --region R --image I …`"
    render.table(rows, COLUMNS, wide=WIDE_COLUMNS, as_json=json_out, empty=empty)


@app.command("show")
@output_options
def show(
    name: str,
    region: RegionOpt = None,
    revision: Annotated[
        int | None, typer.Option("--revision", min=1, help="This revision (default: latest).")
    ] = None,
    json_out: Json = False,
) -> None:
    """Show a configuration: its latest revision (or --revision N); keys by name only."""
    render.detail(
        connect().get(f"/v1/device-configs/{name}", region=region, revision=revision),
        as_json=json_out,
        fields=SHOW_FIELDS,
    )


@app.command("update")
def update(
    name: str,
    region: RegionOpt = None,
    image: Image = None,
    model: Model = None,
    command: Command = None,
    checkpoint: Checkpoint = None,
    datastore: DatastoreOpt = None,
    datastore_path: DatastorePath = None,
    env: Env = None,
    key: Key = None,
    json_out: Json = False,
) -> None:
    """A new revision with the options given (--env, --checkpoint and --key replace the whole list).
    Devices keep the revision they run until `provision device deploy DEVICE --latest`."""
    body = _body(image, model, command, checkpoint, datastore, datastore_path, env, key)
    answer = connect().request(
        "PATCH", f"/v1/device-configs/{name}", json=body, params={"region": region} if region else {}
    )
    render.detail(answer, as_json=json_out, fields=SHOW_FIELDS)


@app.command("remove")
def remove(name: str, region: RegionOpt = None, yes: Yes = False, json_out: Json = False) -> None:
    """Remove a configuration no device is set to (kept as `removed`; its name may be reused)."""
    confirm(f"remove device configuration '{name}'?", yes)
    render.detail(connect().delete(f"/v1/device-configs/{name}", region=region), as_json=json_out)
