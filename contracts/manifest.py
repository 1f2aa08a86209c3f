"""The image manifest (docs/image-builder.md): `manifest.json` and its detached Ed25519 signature
(`manifest.json.sig`). The builder writes and signs it; the control plane accepts it only when `verify`
passes with a key an operator trusted. Both use this module, so the bytes signed are the bytes checked."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any, Literal

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import BaseModel, ConfigDict, Field

from contracts.errors import InvalidInput

SCHEMA = "rigbase.image-manifest/1"
SIGNATURE_SUFFIX = ".sig"


class ManifestError(InvalidInput):
    """The manifest or its signature does not check out; str() says what to do."""

    default_code = "manifest_invalid"


class _KeptSection(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class ImageManifest(BaseModel):
    """The manifest's top level (schema 1). Sections are kept whole (`extra="allow"`): the signature covers
    the exact bytes, and a reader takes what it needs; `canonical` is what gets signed."""

    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)

    schema_: Literal["rigbase.image-manifest/1"] = Field(alias="schema")
    builder: _KeptSection | None = None
    image: _KeptSection | None = None
    targets: dict[str, _KeptSection] | None = None  # "usb" (the image above), "gce" with --target gce
    uki: _KeptSection | None = None
    kernel: _KeptSection | None = None
    verity: _KeptSection | None = None
    pe_hashes: dict[str, str] | None = None
    pcr4: _KeptSection | None = None
    pcr11: list[_KeptSection] | None = None
    pcr12: _KeptSection | None = None
    region: _KeptSection | None = None
    packages: list[_KeptSection] | None = None
    inputs: _KeptSection | None = None


def canonical(manifest: dict[str, Any]) -> bytes:
    """Sorted keys, two-space indent, trailing newline: stable bytes for the same content."""
    return (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()


def public_key_fingerprint(public_key: bytes) -> str:
    """sha256 over the raw 32-byte Ed25519 public key, hex: how the manifest names its signer."""
    return hashlib.sha256(_load_public(public_key).public_bytes_raw()).hexdigest()


def _load_public(public_key: bytes | str) -> Ed25519PublicKey:
    raw = public_key.encode() if isinstance(public_key, str) else public_key
    if b"-----BEGIN" in raw:
        key = serialization.load_pem_public_key(raw)
    elif len(raw) == 32:
        key = Ed25519PublicKey.from_public_bytes(raw)
    else:
        try:
            key = Ed25519PublicKey.from_public_bytes(base64.b64decode(raw.strip(), validate=True))
        except (ValueError, TypeError) as exc:
            raise ManifestError(
                "the public key is neither PEM, raw 32 bytes nor base64; pass the builder's .pub file."
            ) from exc
    if not isinstance(key, Ed25519PublicKey):
        raise ManifestError("the public key is not Ed25519; pass the .pub file `image-builder keygen` wrote.")
    return key


def verify(manifest_bytes: bytes, signature: bytes | str, public_key: bytes | str) -> dict[str, Any]:
    """Check the detached signature over the exact manifest bytes and return the parsed manifest.

    signature: the .sig file's contents (base64) or the raw 64 bytes; public_key: PEM (SPKI), raw 32 bytes
    or base64 of them. Raises ManifestError with a reason the operator can act on."""
    key = _load_public(public_key)
    sig = signature.encode() if isinstance(signature, str) else signature
    if len(sig) != 64:
        try:
            sig = base64.b64decode(sig.strip(), validate=True)
        except (ValueError, TypeError) as exc:
            raise ManifestError(
                "the signature is not base64; pass the manifest.json.sig file the builder wrote."
            ) from exc
    try:
        key.verify(sig, manifest_bytes)
    except InvalidSignature as exc:
        raise ManifestError(
            "the manifest's signature does not verify with this key; the manifest was altered "
            "or signed by another builder."
        ) from exc
    try:
        doc = json.loads(manifest_bytes)
    except ValueError as exc:
        raise ManifestError("the manifest is not JSON; rebuild the image.") from exc
    if doc.get("schema") != SCHEMA:
        raise ManifestError(f"unknown manifest schema {doc.get('schema')!r}; expected {SCHEMA}.")
    return doc
