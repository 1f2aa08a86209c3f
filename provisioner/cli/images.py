"""`provision image`: trust image-builder keys and register signed image manifests, so a region checks
joining nodes against the image it was given (docs/image-builder.md, "Registering images with the
control plane"). Files are read here and sent as base64: the server verifies the exact signed bytes."""

from __future__ import annotations

import base64
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from provisioner.cli import render
from provisioner.cli.common import EXIT_USAGE, Json, Timeout, Wait, Yes, confirm, fail, group, output_options
from provisioner.cli.settings import connect

app = group(
    "Image manifests: trusted image-builder keys and the signed manifests joining nodes are checked against."
)

KEY_COLUMNS = [
    ("id", "ID"),
    ("name", "NAME"),
    ("fingerprint", "FINGERPRINT (SHA-256)"),
    ("created_at", "TRUSTED"),
]
IMAGE_COLUMNS = [
    ("id", "ID"),
    ("region", "REGION"),
    ("manifest_sha256", "MANIFEST SHA-256"),
    ("signed_by", "SIGNED BY"),
    ("checked_pcrs", "CHECKED PCRS"),
    ("published", "PUBLISHED"),
    ("created_at", "REGISTERED"),
]
SHOW_FIELDS = [
    "id",
    "region",
    "manifest_sha256",
    "signed_by",
    "key_fingerprint",
    "image_sha256",
    "uki_sha256",
    "verity_root_hash",
    "pcr11",
    "pcr12",
    "pcr4",
    "checked_pcrs",
    "packages",
    "targets",
    "published",
    "created_at",
]
SIGNATURE_SUFFIX = ".sig"  # contracts.manifest.SIGNATURE_SUFFIX: the builder writes manifest.json.sig


def _read(path: Path, what: str, hint: str, exit_code: int = EXIT_USAGE) -> bytes:
    try:
        return sys.stdin.buffer.read() if str(path) == "-" else path.read_bytes()
    except OSError as exc:
        fail(f"cannot read {what} {path} ({exc.strerror}): {hint}", exit_code=exit_code)


@app.command("trust-key")
def trust_key(
    public_key: Annotated[
        Path,
        typer.Argument(
            dir_okay=False,
            help="The builder's Ed25519 public key (builder.pub from `image-builder keygen`/build).",
        ),
    ],
    name: Annotated[
        str | None, typer.Option("--name", help="A name for the key (default: builder-<fingerprint prefix>).")
    ] = None,
    json_out: Json = False,
) -> None:
    """Trust an image builder's signing key; prints its id and SHA-256 fingerprint."""
    raw = _read(public_key, "public key", "pass the builder.pub that `image-builder keygen` wrote")
    # PEM and base64 files travel as text, a raw 32-byte key as base64 (the API reads all three forms)
    if b"-----BEGIN" in raw or len(raw) != 32:
        body = raw.decode(errors="replace").strip()
    else:
        body = base64.b64encode(raw).decode()
    out = connect().post("/v1/image-keys", {"public_key": body, "name": name})
    render.print_json(out) if json_out else print(f"{out['id']} {out['fingerprint']}")


@app.command("list-keys")
@output_options
def list_keys(json_out: Json = False) -> None:
    """List trusted image-builder keys."""
    render.table(
        connect().get("/v1/image-keys")["items"],
        KEY_COLUMNS,
        as_json=json_out,
        empty="no image builder key trusted yet: `provision image trust-key builder.pub`",
    )


@app.command("untrust-key")
def untrust_key(
    ref: Annotated[str, typer.Argument(help="Key id, name or fingerprint prefix (8+ characters).")],
    force: Annotated[
        bool, typer.Option("--force", help="Also remove the manifests this key signed.")
    ] = False,
    yes: Yes = False,
    json_out: Json = False,
) -> None:
    """Stop trusting an image-builder key (refused while manifests it signed are registered, unless
    --force)."""
    confirm(f"stop trusting image key '{ref}'{' and remove the manifests it signed' if force else ''}?", yes)
    out = connect().delete(f"/v1/image-keys/{ref}", force=str(force).lower())
    render.detail(out, as_json=json_out)


@app.command("register")
def register(
    manifest: Annotated[
        Path, typer.Argument(dir_okay=False, help="DIR/manifest.json as `image-builder build` wrote it.")
    ],
    signature: Annotated[
        Path | None,
        typer.Option(
            "--signature",
            dir_okay=False,
            help="Detached signature (default: MANIFEST.sig, e.g. manifest.json.sig).",
        ),
    ] = None,
    region: Annotated[
        str | None,
        typer.Option(
            "--region",
            "-r",
            help="Region to bind it to (default: the region named in the manifest; must agree with it).",
        ),
    ] = None,
    json_out: Json = False,
) -> None:
    """Verify a signed image manifest against the trusted keys and register it for its region; prints
    its id."""
    data = _read(manifest, "manifest", "pass the manifest.json `image-builder build` wrote")
    sig_path = signature or manifest.with_name(manifest.name + SIGNATURE_SUFFIX)
    # A missing signature is a refusal (exit 1), not a typo: unsigned manifests are never registered.
    sig = _read(
        sig_path, "signature", "pass --signature FILE; an unsigned manifest is never registered", exit_code=1
    )
    out = connect().post(
        "/v1/images",
        {
            "manifest": base64.b64encode(data).decode(),
            "signature": sig.decode(errors="replace"),
            "region": region,
        },
    )
    render.created(out, as_json=json_out)


@app.command("list")
@output_options
def list_images(
    region: Annotated[str | None, typer.Option("--region", "-r", help="Only this region's images.")] = None,
    json_out: Json = False,
) -> None:
    """List registered image manifests (several per region are a rollout: a node matching any one joins)."""
    render.table(
        connect().get("/v1/images", region=region)["items"],
        IMAGE_COLUMNS,
        as_json=json_out,
        empty="no image registered: joins use record mode; `provision image register DIR/manifest.json`",
    )


@app.command("show")
@output_options
def show(
    ref: Annotated[str, typer.Argument(help="Image id or manifest SHA-256 prefix (8+ characters).")],
    json_out: Json = False,
) -> None:
    """Show a registered manifest: signer, digests and the PCR values joining nodes must show."""
    out = connect().get(f"/v1/images/{ref}")
    render.detail(out, as_json=json_out, fields=None if json_out else SHOW_FIELDS)


@app.command("remove")
def remove(
    ref: Annotated[str, typer.Argument(help="Image id or manifest SHA-256 prefix (8+ characters).")],
    yes: Yes = False,
    json_out: Json = False,
) -> None:
    """Unregister a manifest (with none left, the region's joins fall back to record mode)."""
    confirm(f"unregister image '{ref}'?", yes)
    out = connect().delete(f"/v1/images/{ref}")
    render.detail(out, as_json=json_out, fields=None if json_out else SHOW_FIELDS[:4])


def _gce_archive(manifest: Path, data: bytes, archive: Path | None) -> tuple[Path, dict]:
    """The GCE archive next to the manifest (or --archive) and the manifest's description of it."""
    import json

    try:
        target = (json.loads(data).get("targets") or {}).get("gce")
    except ValueError:
        target = None
    if not isinstance(target, dict):
        fail(
            f"{manifest} describes no GCE target: build with `image-builder build --target gce` and publish "
            "that build's manifest.json"
        )
    path = archive or manifest.with_name(str(target["file"]))
    if not path.is_file():
        fail(f"the GCE archive {path} is missing: pass --archive FILE (the build's {target['file']})")
    return path, target


def _send(pub: dict, path: Path, size: int, say: Any) -> int:
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

    from provisioner.client.resumable_upload import upload

    with Progress(
        "uploading", BarColumn(), DownloadColumn(), TransferSpeedColumn(), console=say, transient=True
    ) as bar:
        task = bar.add_task("upload", total=size)
        return upload(
            pub["upload_url"], path, on_progress=lambda done, _total: bar.update(task, completed=done)
        )


@app.command("publish")
def publish(  # noqa: C901
    manifest: Annotated[
        Path, typer.Argument(dir_okay=False, help="DIR/manifest.json of a build made with --target gce.")
    ],
    provider: Annotated[str, typer.Option("--provider", help="Where to publish it: gcp.")],
    archive: Annotated[
        Path | None,
        typer.Option(
            "--archive", dir_okay=False, help="The GCE archive (default: the manifest's, beside it)."
        ),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Check the files and say what would be uploaded; change nothing."),
    ] = False,
    wait: Wait = False,
    timeout: Timeout = 1800.0,
    json_out: Json = False,
) -> None:
    """Publish an image's GCE target to the provider's project: register the manifest if needed, upload the
    archive (resumable: run it again after an interruption), import it into the region's image family.
    The region's storage node and burst VMs boot it once it is published."""
    import hashlib

    from rich.console import Console

    from provisioner.cli import wait as waiting
    from provisioner.client import ControlPlaneError
    from provisioner.client.resumable_upload import crc32c_and_sha256
    from provisioner.domain.states import PublicationState

    data = _read(manifest, "manifest", "pass the manifest.json `image-builder build --target gce` wrote")
    path, target = _gce_archive(manifest, data, archive)
    say = Console(stderr=True)
    say.print(f"checking {path} ({target['size'] / 2**20:.0f} MiB) against the manifest")
    crc32c, sha = crc32c_and_sha256(path)
    if sha != target.get("sha256") or path.stat().st_size != target.get("size"):
        fail(
            f"{path} is not the archive the signed manifest describes (sha256 differs): "
            "rebuild, or pass --archive"
        )
    manifest_sha = hashlib.sha256(data).hexdigest()
    if dry_run:  # files only: no control plane needed
        plan = {
            "dry_run": True,
            "manifest_sha256": manifest_sha,
            "archive": str(path),
            "archive_bytes": target["size"],
            "disk_size_gb": target.get("disk_size_gb"),
            "crc32c": crc32c,
            "provider": provider,
            "would": "register the manifest if needed, upload the archive to the provider's image bucket, "
            "import it with images.insert (Cloud Storage and image storage are billed by the GB-month)",
        }
        render.detail(plan, as_json=json_out)
        return
    client = connect()
    try:
        image = client.get(f"/v1/images/{manifest_sha}")
    except ControlPlaneError as exc:
        if exc.status != 404:
            raise
        sig = _read(
            manifest.with_name(manifest.name + SIGNATURE_SUFFIX),
            "signature",
            "an unsigned manifest is never registered",
            exit_code=1,
        )
        image = client.post(
            "/v1/images",
            {"manifest": base64.b64encode(data).decode(), "signature": sig.decode(errors="replace")},
        )
        say.print(f"registered {image['id']} for region {image['region']}")
    path_of = f"/v1/images/{image['id']}/publications"
    pub = client.post(path_of, {"provider": provider, "crc32c": crc32c})
    for attempt in (1, 2):
        if not pub.get("upload_url"):
            break
        try:
            sent = _send(pub, path, target["size"], say)
        except ControlPlaneError as exc:
            # the session is gone (a week old) or refused the bytes (their CRC32C): one fresh session
            if attempt == 2 or exc.status not in (400, 404, 410):
                raise
            say.print(f"{exc.message.split(';')[0]}: starting a new upload session")
            pub = client.post(path_of, {"provider": provider, "crc32c": crc32c, "restart": True})
            continue
        say.print(f"uploaded {sent} bytes to gs://{pub['bucket']}/{pub['object_name']}")
        break
    pub = client.post(f"/v1/images/{image['id']}/publications/{pub['id']}/complete", {})
    if wait and pub["state"] != PublicationState.PUBLISHED:
        pub = waiting.wait_for_state(
            client,
            f"/v1/images/{image['id']}/publications/{pub['id']}",
            done={PublicationState.PUBLISHED.value},
            failed={PublicationState.FAILED.value},
            timeout=timeout,
        )
    if pub["state"] == PublicationState.FAILED:
        fail(f"publishing {pub['image_name']} failed: {pub['reason']}")
    pub.pop("upload_url", None)
    say.print(f"{pub['image_name']}: {pub['state']} in family {pub['family']}")
    render.created(pub, as_json=json_out)
