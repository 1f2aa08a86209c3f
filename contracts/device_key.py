"""The device-key identity of a device without a TPM (Jetson Xavier; docs/join-protocol.md "Devices
without a TPM"), as both ends compute it.

The key is ECDSA P-256, created on the device at first boot and never leaving it. Its minion_id is
derived exactly like a TPM's (contracts/identity.py): the first 32 hex characters of SHA-256 over the
DER SubjectPublicKeyInfo. Possession is proven by an ECDSA-SHA256 signature over a message that starts
with a label naming its purpose (domain separation: a signature made for a heartbeat can never pass as
a join proof, nor one for another protocol), then binds the join (or node), the control plane's nonce and
— at join — the SHA-256 of the report the device sent, so step 1's report cannot be swapped by anyone
who replays it."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from contracts.identity import minion_id_from_spki

JOIN_LABEL: Final = b"rigbase device-key join v1\x00"
HEARTBEAT_LABEL: Final = b"rigbase device-key heartbeat v1\x00"
CURVE_NAME: Final = "secp256r1"


class DeviceKeyError(ValueError):
    """The public key is not a usable device key; the message says why."""


def load_public(spki_der: bytes) -> ec.EllipticCurvePublicKey:
    """The device key from its DER SubjectPublicKeyInfo; DeviceKeyError unless it is ECDSA P-256."""
    try:
        key = serialization.load_der_public_key(spki_der)
    except (ValueError, TypeError) as exc:
        raise DeviceKeyError(f"not a DER SubjectPublicKeyInfo ({exc})") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != CURVE_NAME:
        raise DeviceKeyError(f"a device key is ECDSA P-256, this is {type(key).__name__.removeprefix('_')}")
    return key


def spki(key: ec.EllipticCurvePublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def minion_id(spki_der: bytes) -> str:
    return minion_id_from_spki(spki_der)


def report_digest(inventory: Mapping[str, Any], requirements: Mapping[str, Any]) -> bytes:
    """SHA-256 of the join report in canonical JSON (sorted keys, no spaces), as both ends parse it."""
    canonical = json.dumps(
        {"inventory": dict(inventory), "requirements": dict(requirements)},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=True,
    )
    return hashlib.sha256(canonical.encode()).digest()


def join_message(join_id: str, minion_id: str, nonce: bytes, digest: bytes) -> bytes:
    """What the device signs to prove its key at join."""
    return b"\x00".join((JOIN_LABEL + join_id.encode(), minion_id.encode(), nonce, digest))


def heartbeat_message(node_id: str, nonce: bytes) -> bytes:
    """What the device signs to answer a heartbeat's nonce (continuous proof of possession)."""
    return b"\x00".join((HEARTBEAT_LABEL + node_id.encode(), nonce))


def sign(private: ec.EllipticCurvePrivateKey, message: bytes) -> bytes:
    return private.sign(message, ec.ECDSA(hashes.SHA256()))


def verifies(spki_der: bytes, signature: bytes, message: bytes) -> bool:
    try:
        load_public(spki_der).verify(signature, message, ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, DeviceKeyError, ValueError):
        return False
    return True
