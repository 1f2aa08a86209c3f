"""The builder's side of the image manifest: its signing key (`image-builder keygen`) and the signature.
The schema, `canonical`, `verify` and the key fingerprint are the shared contract (contracts/manifest.py).

The control plane trusts a builder's public key (`provision image trust-key`) and then accepts manifests
(`provision image register`) only when `verify` passes. Schema: docs/image-builder.md."""

from __future__ import annotations

import base64
import os
from pathlib import Path

from contracts.manifest import (
    SCHEMA,
    SIGNATURE_SUFFIX,
    ManifestError,
    canonical,
    public_key_fingerprint,
    verify,
)

__all__ = [
    "SCHEMA",
    "SIGNATURE_SUFFIX",
    "ManifestError",
    "canonical",
    "keygen",
    "load_private_key",
    "public_key_fingerprint",
    "sign",
    "verify",
]


def keygen(private_path: Path, force: bool = False) -> tuple[Path, Path]:
    """Write an Ed25519 private key (PKCS#8 PEM, mode 0600) and its public key (`.pub`, SPKI PEM)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    public_path = private_path.with_suffix(".pub")
    if private_path.exists() and not force:
        raise ManifestError(
            f"{private_path} already exists; pass --force to replace it or use --key to pick another path."
        )
    key = Ed25519PrivateKey.generate()
    private_path.parent.mkdir(parents=True, exist_ok=True)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
    public_path.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
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


def sign(manifest_bytes: bytes, private_key) -> bytes:
    """Detached signature file contents: base64 of the 64-byte Ed25519 signature, newline-terminated."""
    return base64.b64encode(private_key.sign(manifest_bytes)) + b"\n"
