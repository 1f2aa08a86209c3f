"""`provision image`: trust image-builder keys and register signed image manifests, so a region checks
joining nodes against the image it was given (docs/image-builder.md, "Registering images with the
control plane"). Files are read here and sent as base64: the server verifies the exact signed bytes."""

from __future__ import annotations

import base64
import sys
from pathlib import Path
from typing import Annotated

import typer

from provisioner.cli import render
from provisioner.cli.common import EXIT_USAGE, Json, Yes, confirm, fail, group, output_options
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
