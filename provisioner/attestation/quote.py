"""Verify a TPM quote: structure, AK signature, nonce, PCR selection, and that the reported PCR values
hash to the digest the TPM signed. Order matters: nothing inside TPMS_ATTEST is believed before the
signature over it has verified."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from contracts.attestation import ATTESTED_PCRS
from provisioner.attestation.keys import public_key, signature_valid
from provisioner.attestation.refusals import Refusal, RefusalCode, refuse
from provisioner.attestation.tpm_structures import (
    Alg,
    MalformedStructure,
    QuoteInfo,
    TpmPublic,
    parse_quote,
    parse_signature,
)


@dataclass(frozen=True)
class QuoteEvidence:
    attest: bytes  # TPMS_ATTEST, exactly as signed
    signature: bytes  # TPMT_SIGNATURE
    pcrs: Mapping[int, bytes]  # sha256 values the node read for the quoted PCRs
    event_log: bytes | None = None  # the firmware's TCG event log, when the node sent one (boot_path.py)


@dataclass(frozen=True)
class VerifiedQuote:
    info: QuoteInfo
    pcrs: dict[int, bytes]


def verify_quote(
    ak: TpmPublic, evidence: QuoteEvidence, nonce: bytes, required: Sequence[int] = ATTESTED_PCRS
) -> VerifiedQuote | Refusal:
    """A VerifiedQuote, or the first Refusal in the order structure → signature → nonce → PCRs."""
    try:
        info = parse_quote(evidence.attest)
        signature = parse_signature(evidence.signature)
    except MalformedStructure as exc:
        return refuse(RefusalCode.quote_malformed, str(exc))
    if not signature_valid(public_key(ak), signature, evidence.attest):
        return refuse(RefusalCode.quote_signature_invalid)
    if not hmac.compare_digest(info.extra_data, nonce):
        return refuse(RefusalCode.nonce_mismatch)
    wanted = tuple(sorted(set(required)))
    if (
        len(info.pcr_select) != 1
        or info.pcr_select[0].bank != Alg.SHA256
        or info.pcr_select[0].indices != wanted
    ):
        got = ", ".join(f"{s.bank.name.lower()}:{list(s.indices)}" for s in info.pcr_select) or "none"
        return refuse(RefusalCode.pcr_selection_mismatch, f"wanted sha256:{list(wanted)}, quoted {got}")
    if sorted(evidence.pcrs) != list(wanted):
        return refuse(RefusalCode.pcr_digest_mismatch, missing=sorted(set(wanted) - set(evidence.pcrs)))
    # TPM2_Quote hashes the selected PCR values in ascending index order.
    digest = hashlib.sha256(b"".join(evidence.pcrs[i] for i in wanted)).digest()
    if not hmac.compare_digest(digest, info.pcr_digest):
        return refuse(RefusalCode.pcr_digest_mismatch)
    return VerifiedQuote(info, {i: bytes(evidence.pcrs[i]) for i in wanted})
