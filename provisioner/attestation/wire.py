"""The control plane's side of the join messages. The messages themselves are the shared contract
(contracts/messages.py, docs/join-protocol.md); what stays here is control-plane only: the pending join
it keeps between the two calls, and the conversion of a quote message into the verifier's evidence."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, TypeAdapter

from contracts.messages import B64Bytes, HexBytes, MinionId, QuoteMessage
from provisioner.attestation.quote import QuoteEvidence


def quote_evidence(quote: QuoteMessage) -> QuoteEvidence:
    """What the quote verifier checks, from a quote as it came over the wire."""
    return QuoteEvidence(quote.attest, quote.signature, dict(quote.pcrs), quote.event_log)


class PendingJoin(BaseModel):
    """What the control plane keeps between the two calls (store it keyed by join_id, e.g. as JSON).
    Only a hash of the secret is kept, so a leaked row cannot answer the challenge."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    join_id: str
    minion_id: MinionId
    ek_public: B64Bytes
    ek_certificate: B64Bytes | None
    ak_public: B64Bytes
    secret_sha256: HexBytes
    nonce: B64Bytes
    expires_at: datetime


class PendingKeyJoin(BaseModel):
    """Between the two calls of a device-key join (contracts/device_key.py): the key, the nonce to sign
    and the digest of the report step 1 carried, which the signature must cover."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    join_id: str
    minion_id: MinionId
    device_key: B64Bytes
    report_sha256: HexBytes
    nonce: B64Bytes
    expires_at: datetime


_PENDING: TypeAdapter[PendingJoin | PendingKeyJoin] = TypeAdapter(PendingJoin | PendingKeyJoin)


def pending_from_json(text: str) -> PendingJoin | PendingKeyJoin:
    """A stored pending join of either kind (each model forbids the other's fields, so one matches)."""
    return _PENDING.validate_json(text)
