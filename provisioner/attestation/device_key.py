"""The join of a device without a TPM, transport-free (docs/join-protocol.md "Devices without a TPM"):

    begin(KeyJoinRequest) → (KeyJoinChallenge to send, PendingKeyJoin to store) or a Refusal
    finish(PendingKeyJoin, KeyProofRequest) → KeyAttested or a Refusal

The device proves possession of the private half of its device key by signing the challenge's nonce
bound to the join, its minion_id and the report it sent (contracts/device_key.py). What this proves is
weaker than a TPM's join — the key is a file on the device, not a key a TPM will never release, and no
boot measurement is checked — which is why only regions that opt in accept it (services/fleet/join.py)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from contracts import device_key
from contracts.messages import KeyJoinChallenge, KeyJoinRequest, KeyProofRequest
from provisioner.attestation.nonces import LateAnswer, NonceIssuer, redeem_allowing_late
from provisioner.attestation.refusals import Refusal, RefusalCode, refuse
from provisioner.attestation.wire import PendingKeyJoin


@dataclass(frozen=True)
class KeyAttested:
    """A verified device-key proof: what to record for the device."""

    minion_id: str
    device_key: bytes  # DER SubjectPublicKeyInfo, kept to check every later heartbeat's signature


@dataclass
class KeyJoinVerifier:
    nonces: NonceIssuer

    def begin(
        self, request: KeyJoinRequest, *, join_id: str | None = None
    ) -> tuple[KeyJoinChallenge, PendingKeyJoin] | Refusal:
        try:
            device_key.load_public(request.device_key)
        except device_key.DeviceKeyError as exc:
            return refuse(RefusalCode.device_key_invalid, str(exc))
        actual_id = device_key.minion_id(request.device_key)
        if actual_id != request.minion_id:
            return refuse(
                RefusalCode.minion_id_mismatch,
                f"claimed {request.minion_id}, the device key gives {actual_id}",
                claimed=request.minion_id,
                actual=actual_id,
            )
        join_id = join_id or secrets.token_urlsafe(16)
        nonce = self.nonces.issue(f"join:{join_id}")
        pending = PendingKeyJoin(
            join_id=join_id,
            minion_id=actual_id,
            device_key=request.device_key,
            report_sha256=device_key.report_digest(request.inventory, request.requirements),
            nonce=nonce.nonce,
            expires_at=nonce.expires_at,
        )
        return KeyJoinChallenge(join_id=join_id, nonce=nonce.nonce, expires_at=nonce.expires_at), pending

    def finish(self, pending: PendingKeyJoin, proof: KeyProofRequest) -> KeyAttested | Refusal:
        refusal = self.nonces.redeem(pending.nonce, f"join:{pending.join_id}")
        if refusal:
            return refusal
        message = device_key.join_message(
            pending.join_id, pending.minion_id, pending.nonce, pending.report_sha256
        )
        if not device_key.verifies(pending.device_key, proof.signature, message):
            return refuse(RefusalCode.device_key_signature_invalid)
        return KeyAttested(minion_id=pending.minion_id, device_key=pending.device_key)


def verify_fresh_signature(
    nonces: NonceIssuer, node_id: str, device_key_spki: bytes, nonce: bytes, signature: bytes
) -> Refusal | LateAnswer | None:
    """A heartbeat's answer to its nonce (continuous proof of possession, as continuous.py checks a
    quote): spend the node's nonce, then check the signature with the key recorded at join. A signature
    that verifies over an expired nonce is late, as a quote would be (continuous.py)."""
    spent = redeem_allowing_late(nonces, nonce, f"node:{node_id}")
    if isinstance(spent, Refusal):
        return spent
    if not device_key.verifies(device_key_spki, signature, device_key.heartbeat_message(node_id, nonce)):
        return refuse(RefusalCode.device_key_signature_invalid)
    return spent
