"""manifest.json + its detached Ed25519 signature, and the builder's signing key (`image-builder keygen`).

The control plane trusts a builder's public key (`provision image trust-key`) and then accepts manifests
(`provision image register`) only when `verify` passes. Schema: docs/image-builder.md."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

SCHEMA = "rigbase.image-manifest/1"
SIGNATURE_SUFFIX = ".sig"


class ManifestError(Exception):
    """The manifest or its signature does not check out; str() says what to do."""


def default_key_path() -> Path:
    from provisioner.config import rigbase_home

    return rigbase_home() / "image-builder" / "signing-key.pem"


def default_cache_dir() -> Path:
    """Shared by the CLI, the image tests and the benchmark: the debootstrap stage is keyed by inputs."""
    from provisioner.config import rigbase_home

    return rigbase_home() / "cache" / "image-builder"


def keygen(private_path: Path, force: bool = False) -> tuple[Path, Path]:
    """Write an Ed25519 private key (PKCS#8 PEM, mode 0600) and its public key (`.pub`, SPKI PEM)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    public_path = private_path.with_suffix(".pub")
    if private_path.exists() and not force:
        raise ManifestError(f"{private_path} already exists; pass --force to replace it or use --key to pick another path.")
    key = Ed25519PrivateKey.generate()
    private_path.parent.mkdir(parents=True, exist_ok=True)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
    public_path.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                           serialization.PublicFormat.SubjectPublicKeyInfo))
    return private_path, public_path


def load_private_key(path: Path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    if not path.exists():
        raise ManifestError(f"no signing key at {path}; run `image-builder keygen` first or pass --key.")
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ManifestError(f"{path} is not an Ed25519 key; make one with `image-builder keygen`.")
    return key


def public_key_fingerprint(public_key: bytes) -> str:
    """sha256 over the raw 32-byte Ed25519 public key, hex: how the manifest names its signer."""
    import hashlib

    return hashlib.sha256(_load_public(public_key).public_bytes_raw()).hexdigest()


def canonical(manifest: dict[str, Any]) -> bytes:
    """Sorted keys, two-space indent, trailing newline: stable bytes for the same content."""
    return (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()


def sign(manifest_bytes: bytes, private_key) -> bytes:
    """Detached signature file contents: base64 of the 64-byte Ed25519 signature, newline-terminated."""
    return base64.b64encode(private_key.sign(manifest_bytes)) + b"\n"


def _load_public(public_key: bytes | str):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    raw = public_key.encode() if isinstance(public_key, str) else public_key
    if b"-----BEGIN" in raw:
        key = serialization.load_pem_public_key(raw)
    elif len(raw) == 32:
        key = Ed25519PublicKey.from_public_bytes(raw)
    else:
        try:
            key = Ed25519PublicKey.from_public_bytes(base64.b64decode(raw.strip(), validate=True))
        except (ValueError, TypeError) as exc:
            raise ManifestError("the public key is neither PEM, raw 32 bytes nor base64; pass the builder's .pub file.") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise ManifestError("the public key is not Ed25519; pass the .pub file `image-builder keygen` wrote.")
    return key


def verify(manifest_bytes: bytes, signature: bytes | str, public_key: bytes | str) -> dict[str, Any]:
    """Check the detached signature over the exact manifest bytes and return the parsed manifest.

    signature: the .sig file's contents (base64) or the raw 64 bytes; public_key: PEM (SPKI), raw 32 bytes
    or base64 of them. Raises ManifestError with a reason the operator can act on."""
    from cryptography.exceptions import InvalidSignature

    key = _load_public(public_key)
    sig = signature.encode() if isinstance(signature, str) else signature
    if len(sig) != 64:
        try:
            sig = base64.b64decode(sig.strip(), validate=True)
        except (ValueError, TypeError) as exc:
            raise ManifestError("the signature is not base64; pass the manifest.json.sig file the builder wrote.") from exc
    try:
        key.verify(sig, manifest_bytes)
    except InvalidSignature as exc:
        raise ManifestError("the manifest's signature does not verify with this key; the manifest was altered "
                            "or signed by another builder.") from exc
    try:
        doc = json.loads(manifest_bytes)
    except ValueError as exc:
        raise ManifestError("the manifest is not JSON; rebuild the image.") from exc
    if doc.get("schema") != SCHEMA:
        raise ManifestError(f"unknown manifest schema {doc.get('schema')!r}; expected {SCHEMA}.")
    return doc
