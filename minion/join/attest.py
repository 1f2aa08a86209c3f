"""The minion's half of the attested join (docs/join-protocol.md), transport-free:

    payload = join_request(session, ak, join_token=…, inventory=…, requirements=…)   # POST /v1/join
    challenge = Challenge.from_json(response_body)
    proof = proof_payload(session, ak, challenge)                                    # POST /v1/join/{id}/proof

and `quote_payload` for the quotes continuous attestation asks for in heartbeat responses.
The shapes mirror provisioner/attestation/wire.py by format, not by import: the minion never imports the
control plane, and the JSON document is the contract.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Mapping

from minion.tpm.session import PCR_BANK, AttestationKey, Quote, TpmSession

PROTOCOL_VERSION = 1


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text, validate=True)


@dataclass(frozen=True)
class Challenge:
    """The body of the control plane's answer to POST /v1/join."""

    join_id: str
    credential_blob: bytes
    encrypted_secret: bytes
    nonce: bytes
    pcrs: tuple[int, ...]
    expires_at: datetime

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Challenge:
        if body.get("pcr_bank", PCR_BANK) != PCR_BANK:
            raise ValueError(f"the control plane asks for PCR bank {body.get('pcr_bank')!r}; only sha256 is supported")
        return cls(
            join_id=str(body["join_id"]),
            credential_blob=_unb64(body["credential_blob"]),
            encrypted_secret=_unb64(body["encrypted_secret"]),
            nonce=_unb64(body["nonce"]),
            pcrs=tuple(int(i) for i in body["pcrs"]),
            expires_at=datetime.fromisoformat(str(body["expires_at"]).replace("Z", "+00:00")),
        )


def join_request(
    session: TpmSession,
    ak: AttestationKey,
    *,
    join_token: str,
    inventory: Mapping[str, Any] | None = None,
    requirements: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """POST /v1/join body: identity (minion_id, EK, EK certificate, AK) plus the node's reports."""
    ek = session.endorsement_key()
    return {
        "version": PROTOCOL_VERSION,
        "minion_id": ek.minion_id,
        "ek_public": _b64(ek.public),
        "ek_certificate": _b64(ek.certificate) if ek.certificate else None,
        "ak_public": _b64(ak.public),
        "join_token": join_token,
        "inventory": dict(inventory or {}),
        "requirements": dict(requirements or {}),
    }


def quote_json(quote: Quote) -> dict[str, Any]:
    return {
        "attest": _b64(quote.attest),
        "signature": _b64(quote.signature),
        "pcr_bank": quote.bank,
        "pcrs": {str(i): value.hex() for i, value in sorted(quote.pcrs.items())},
    }


def quote_payload(session: TpmSession, ak: AttestationKey, nonce: bytes, pcrs: tuple[int, ...] | None = None) -> dict[str, Any]:
    """A quote over `nonce` in wire form (join proof and continuous attestation)."""
    quote = session.quote(ak, nonce, pcrs) if pcrs else session.quote(ak, nonce)
    return quote_json(quote)


def proof_payload(session: TpmSession, ak: AttestationKey, challenge: Challenge) -> dict[str, Any]:
    """POST /v1/join/{join_id}/proof body: the activated secret and a quote over the challenge's nonce."""
    secret = session.activate_credential(ak, challenge.credential_blob, challenge.encrypted_secret)
    return {
        "version": PROTOCOL_VERSION,
        "activated_secret": _b64(secret),
        "quote": quote_payload(session, ak, challenge.nonce, challenge.pcrs),
    }
