"""The device key of a device without a TPM (Jetson Xavier): the minion's identity and its proofs,
transport-free (docs/join-protocol.md "Devices without a TPM", contracts/device_key.py).

The key is ECDSA P-256, created once — at the first `minion id`, `join` or `run` with `--device-key`, which
on a device is its first boot — and kept as `device-key.pem` (PKCS#8, 0600) in the state directory. It
is never replaced: a key file that cannot be read stops the minion with the way out, because a new key
would be a new minion_id, and the device would have to be added again under it."""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from contracts import device_key
from contracts.messages import KeyJoinChallenge, KeyJoinRequest, KeyProofRequest, to_wire

KEY_FILE = "device-key.pem"


class DeviceKeyUnusable(RuntimeError):
    """The key file exists but cannot be used; the message says what to do."""


@dataclass(frozen=True)
class DeviceKey:
    private: ec.EllipticCurvePrivateKey
    path: Path

    @classmethod
    def load_or_create(cls, state_dir: Path) -> DeviceKey:
        path = state_dir / KEY_FILE
        try:
            return cls(_load(path), path)
        except FileNotFoundError:
            pass
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        private = ec.generate_private_key(ec.SECP256R1())
        pem = private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        try:  # O_EXCL: two minion processes starting at once must not end up with two identities
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return cls(_load(path), path)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
            f.flush()
            os.fsync(f.fileno())
        return cls(private, path)

    @property
    def spki(self) -> bytes:
        return device_key.spki(self.private.public_key())

    @property
    def minion_id(self) -> str:
        return device_key.minion_id(self.spki)

    def join_request(
        self, *, join_token: str, inventory: Mapping[str, Any], requirements: Mapping[str, Any]
    ) -> dict[str, Any]:
        """POST /v1/join body of a device without a TPM."""
        return to_wire(
            KeyJoinRequest(
                minion_id=self.minion_id,
                device_key=self.spki,
                join_token=join_token,
                inventory=dict(inventory),
                requirements=dict(requirements),
            )
        )

    def proof(
        self, challenge: KeyJoinChallenge, inventory: Mapping[str, Any], requirements: Mapping[str, Any]
    ) -> dict[str, Any]:
        """POST /v1/join/{join_id}/proof body: the signature over the challenge and the report sent."""
        digest = device_key.report_digest(inventory, requirements)
        message = device_key.join_message(challenge.join_id, self.minion_id, challenge.nonce, digest)
        return to_wire(KeyProofRequest(signature=device_key.sign(self.private, message)))

    def heartbeat_signature(self, node_id: str, nonce_b64: str) -> bytes:
        """The answer to a heartbeat's nonce (where a TPM node sends a quote)."""
        message = device_key.heartbeat_message(node_id, base64.b64decode(nonce_b64))
        return device_key.sign(self.private, message)


def _load(path: Path) -> ec.EllipticCurvePrivateKey:
    data = path.read_bytes()  # FileNotFoundError: no key yet
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise DeviceKeyUnusable(
            f"{path} is not a readable device key ({exc}); restore it from a backup — a new key is a new "
            "minion_id, and the device would have to be removed and added again under it"
        ) from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != device_key.CURVE_NAME:
        raise DeviceKeyUnusable(f"{path} holds no ECDSA P-256 key; restore the device's key from a backup")
    if path.stat().st_mode & 0o077:
        os.chmod(path, 0o600)  # tightened: the key is the device's identity
    return key
