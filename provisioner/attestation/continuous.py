"""Continuous attestation: every K heartbeats the control plane hands the node a nonce (in the heartbeat
response) and the next heartbeat carries a quote over it. The quote must verify against the AK recorded
at join time, pass the boot-path check of its event log (boot_path.py) and show the PCR values the
region's policy expects (the recorded baseline in record mode); a refusal moves the node to errored with
the refusal's message as the reason."""

from __future__ import annotations

from collections.abc import Sequence

from contracts.attestation import ATTESTED_PCRS
from provisioner.attestation.boot_path import BootPathPolicy
from provisioner.attestation.nonces import NonceIssuer, NonceRecord
from provisioner.attestation.pcr_policy import PcrPolicy
from provisioner.attestation.quote import QuoteEvidence, VerifiedQuote
from provisioner.attestation.refusals import Refusal
from provisioner.attestation.verifier import check_quote

DEFAULT_EVERY_HEARTBEATS = 10  # at the default 30 s heartbeat: a fresh quote every 5 minutes
# A quote request the node lets this many heartbeats pass without answering moves it to errored: a node
# that ignores quote requests must not stay in service on the strength of its join alone.
DEFAULT_QUOTE_GRACE_BEATS = 3


def quote_due(heartbeat_count: int, every: int = DEFAULT_EVERY_HEARTBEATS) -> bool:
    """Whether the heartbeat numbered `heartbeat_count` (1-based) should ask for a fresh quote."""
    return every > 0 and heartbeat_count % every == 0


def issue_quote_nonce(nonces: NonceIssuer, node_id: str) -> NonceRecord:
    return nonces.issue(f"node:{node_id}")


def verify_fresh_quote(
    nonces: NonceIssuer,
    node_id: str,
    ak_public: bytes,
    nonce: bytes,
    evidence: QuoteEvidence,
    policy: PcrPolicy,
    required: Sequence[int] = ATTESTED_PCRS,
    boot: BootPathPolicy = BootPathPolicy(),
) -> VerifiedQuote | Refusal:
    """Spend the node's nonce, then check the quote against the recorded AK, the boot path and the PCR
    policy."""
    refusal = nonces.redeem(nonce, f"node:{node_id}")
    if refusal:
        return refusal
    result = check_quote(ak_public, evidence, nonce, policy, required, boot)
    return result if isinstance(result, Refusal) else result[0]
