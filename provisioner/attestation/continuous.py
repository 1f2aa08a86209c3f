"""Continuous attestation: every K heartbeats the control plane hands the node a nonce (in the heartbeat
response) and the next heartbeat carries a quote over it. The quote must verify against the AK recorded
at join time, pass the boot-path check of its event log (boot_path.py) and show the PCR values the
region's policy expects (the recorded baseline in record mode); a refusal moves the node to errored with
the refusal's message as the reason.

An answer that verifies but comes after its nonce expired is late, not refused (LateAnswer): it proves
nothing about the node now, and nothing against it. A control plane that falls behind (a fleet's beats
queued for most of an interval) would otherwise error healthy nodes by the dozen for its own delay. The
node is asked again, and the grace keeps counting from the first request, so a node that is always late
still goes errored. A late answer that does not verify (a changed PCR, another AK) is refused as any
other: what it shows against the node does not depend on when it came."""

from __future__ import annotations

from collections.abc import Sequence

from contracts.attestation import ATTESTED_PCRS
from provisioner.attestation.boot_path import BootPathPolicy
from provisioner.attestation.nonces import LateAnswer, NonceIssuer, NonceRecord, redeem_allowing_late
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
) -> VerifiedQuote | Refusal | LateAnswer:
    """Spend the node's nonce, then check the quote against the recorded AK, the boot path and the PCR
    policy: a quote that passes over an expired nonce is a LateAnswer (module docstring)."""
    spent = redeem_allowing_late(nonces, nonce, f"node:{node_id}")
    if isinstance(spent, Refusal):
        return spent
    result = check_quote(ak_public, evidence, nonce, policy, required, boot)
    if isinstance(result, Refusal):
        return result
    return spent or result[0]
