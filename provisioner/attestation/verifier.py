"""The attested join, control-plane side, as two steps that return data:

`begin(JoinRequest)` → (JoinChallenge to send, PendingJoin to store) or a Refusal:
    EK public well-formed → EK certificate chains to a trusted vendor CA (or the region accepts EKs
    without one) → the certificate certifies this EK → minion_id recomputed from the EK matches the
    claim → AK is a restricted signing key → MakeCredential bound to the AK's name + fresh nonce.
`finish(PendingJoin, ProofRequest, PcrPolicy)` → Attested or a Refusal:
    nonce issued for this join, unused, unexpired → activated secret right → quote structure and AK
    signature → quote over this nonce → PCR selection and digest → boot path (the event log replays to
    PCR 4, its EFI applications are the manifests') → PCR values against the policy.

Transport-agnostic: the HTTP routes parse the bodies into the wire models, call these, write the audit
entry for a Refusal and answer `refusal.as_error()`.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from contracts.attestation import ATTESTED_PCRS, PCR_BANK
from contracts.messages import JoinChallenge, JoinRequest, ProofRequest
from provisioner.attestation.boot_path import BootPathPolicy, check_boot_path
from provisioner.attestation.credential import make_credential
from provisioner.attestation.ek_certs import ChainError, TrustStore, load_certificate, verify_chain
from provisioner.attestation.keys import minion_id_for, public_key, spki_der
from provisioner.attestation.nonces import NonceIssuer
from provisioner.attestation.pcr_policy import PcrPolicy
from provisioner.attestation.quote import QuoteEvidence, VerifiedQuote, verify_quote
from provisioner.attestation.refusals import Refusal, RefusalCode, refuse
from provisioner.attestation.tpm_structures import (
    Alg,
    MalformedStructure,
    ObjectAttr,
    TpmPublic,
    parse_public,
)
from provisioner.attestation.wire import PendingJoin, quote_evidence

SECRET_BYTES = 32
# Attributes of the standard TCG EK template, and of any AK we accept (a restricted signing key that
# cannot leave the TPM and whose private part the TPM generated).
EK_ATTRS = (
    ObjectAttr.FIXED_TPM
    | ObjectAttr.FIXED_PARENT
    | ObjectAttr.SENSITIVE_DATA_ORIGIN
    | ObjectAttr.RESTRICTED
    | ObjectAttr.DECRYPT
)
AK_ATTRS = (
    ObjectAttr.FIXED_TPM
    | ObjectAttr.FIXED_PARENT
    | ObjectAttr.SENSITIVE_DATA_ORIGIN
    | ObjectAttr.RESTRICTED
    | ObjectAttr.SIGN_ENCRYPT
)


@dataclass(frozen=True)
class RegionTrust:
    """The region's attestation settings: trusted vendor CAs and whether certificate-less EKs may join."""

    store: TrustStore
    allow_ek_without_certificate: bool = False
    # the node's EK as its cloud reported it (GCP: getShieldedInstanceIdentity, pinned before the VM
    # booted): that EK is trusted by the pin, whichever CA issued its certificate (Google's, for a vTPM)
    pinned_ek: bytes | None = None


@dataclass(frozen=True)
class Attested:
    """A successful join proof: what to record for the node."""

    minion_id: str
    ek_public: bytes
    ek_certificate: bytes | None
    ak_public: bytes  # kept for continuous attestation
    pcrs: dict[int, bytes]
    pcr_record: dict[int, bytes] | None  # record mode, first attestation: store as the baseline
    reset_count: int
    restart_count: int


@dataclass
class JoinVerifier:
    nonces: NonceIssuer
    required_pcrs: Sequence[int] = field(default=ATTESTED_PCRS)

    # -- step 1 ---------------------------------------------------------------------------------------
    def begin(
        self,
        request: JoinRequest,
        trust: RegionTrust,
        *,
        join_id: str | None = None,
        now: datetime | None = None,
    ) -> tuple[JoinChallenge, PendingJoin] | Refusal:
        ek = _parse_key(request.ek_public, RefusalCode.ek_invalid)
        if isinstance(ek, Refusal):
            return ek
        if ek.type != Alg.RSA or ek.rsa_bits != 2048 or not ek.has(EK_ATTRS):
            return refuse(
                RefusalCode.ek_invalid, "not an RSA-2048 restricted decryption key from the EK template"
            )
        ek_key = public_key(ek)
        refusal = _check_ek_certificate(request.ek_certificate, spki_der(ek_key), trust, now)
        if refusal:
            return refusal
        actual_id = minion_id_for(ek_key)
        if actual_id != request.minion_id:
            return refuse(
                RefusalCode.minion_id_mismatch,
                f"claimed {request.minion_id}, EK gives {actual_id}",
                claimed=request.minion_id,
                actual=actual_id,
            )
        ak = _parse_key(request.ak_public, RefusalCode.ak_invalid)
        if isinstance(ak, Refusal):
            return ak
        if not ak.has(AK_ATTRS) or ak.has(ObjectAttr.DECRYPT) or ak.name_alg != Alg.SHA256:
            return refuse(
                RefusalCode.ak_invalid, "needs fixedTPM, fixedParent, sensitiveDataOrigin, restricted, sign"
            )

        join_id = join_id or secrets.token_urlsafe(16)
        secret = secrets.token_bytes(SECRET_BYTES)
        challenge = make_credential(ek, secret, ak.name)
        nonce = self.nonces.issue(f"join:{join_id}")
        message = JoinChallenge(
            join_id=join_id,
            credential_blob=challenge.credential_blob,
            encrypted_secret=challenge.encrypted_secret,
            nonce=nonce.nonce,
            pcr_bank=PCR_BANK,
            pcrs=sorted(self.required_pcrs),
            expires_at=nonce.expires_at,
        )
        pending = PendingJoin(
            join_id=join_id,
            minion_id=actual_id,
            ek_public=request.ek_public,
            ek_certificate=request.ek_certificate,
            ak_public=request.ak_public,
            secret_sha256=hashlib.sha256(secret).digest(),
            nonce=nonce.nonce,
            expires_at=nonce.expires_at,
        )
        return message, pending

    # -- step 2 ---------------------------------------------------------------------------------------
    def finish(
        self,
        pending: PendingJoin,
        proof: ProofRequest,
        policy: PcrPolicy,
        boot: BootPathPolicy = BootPathPolicy(),
    ) -> Attested | Refusal:
        refusal = self.nonces.redeem(pending.nonce, f"join:{pending.join_id}")
        if refusal:
            return refusal
        if not hmac.compare_digest(hashlib.sha256(proof.activated_secret).digest(), pending.secret_sha256):
            return refuse(RefusalCode.wrong_secret)
        result = check_quote(
            pending.ak_public, quote_evidence(proof.quote), pending.nonce, policy, self.required_pcrs, boot
        )
        if isinstance(result, Refusal):
            return result
        verified, record = result
        return Attested(
            minion_id=pending.minion_id,
            ek_public=pending.ek_public,
            ek_certificate=pending.ek_certificate,
            ak_public=pending.ak_public,
            pcrs=verified.pcrs,
            pcr_record=record,
            reset_count=verified.info.reset_count,
            restart_count=verified.info.restart_count,
        )


def check_quote(
    ak_public: bytes,
    evidence: QuoteEvidence,
    nonce: bytes,
    policy: PcrPolicy,
    required: Sequence[int] = ATTESTED_PCRS,
    boot: BootPathPolicy = BootPathPolicy(),
) -> tuple[VerifiedQuote, dict[int, bytes] | None] | Refusal:
    """Quote checks + boot path + PCR policy, shared by the join proof and continuous attestation."""
    ak = _parse_key(ak_public, RefusalCode.ak_invalid)
    if isinstance(ak, Refusal):
        return ak
    verified = verify_quote(ak, evidence, nonce, required)
    if isinstance(verified, Refusal):
        return verified
    refusal = check_boot_path(evidence.event_log, verified.pcrs, boot)
    if refusal:
        return refusal
    verdict = policy.check(verified.pcrs)
    if verdict.refusal:
        return verdict.refusal
    return verified, verdict.record


def _parse_key(data: bytes, code: RefusalCode) -> TpmPublic | Refusal:
    try:
        return parse_public(data)
    except MalformedStructure as exc:
        return refuse(code, str(exc))


def _check_ek_certificate(
    cert_der: bytes | None, ek_spki: bytes, trust: RegionTrust, now: datetime | None
) -> Refusal | None:
    if trust.pinned_ek is not None and trust.pinned_ek == ek_spki:
        return None
    if cert_der is None:
        return None if trust.allow_ek_without_certificate else refuse(RefusalCode.ek_certificate_missing)
    try:
        cert = load_certificate(cert_der)
    except ValueError as exc:
        return refuse(RefusalCode.ek_untrusted_ca, f"unreadable certificate: {exc}")
    try:
        path = verify_chain(cert, trust.store, now)
    except ChainError as exc:
        return refuse(RefusalCode.ek_untrusted_ca, str(exc), issuer=cert.issuer.rfc4514_string())
    if spki_der(cert.public_key()) != ek_spki:  # type: ignore[arg-type]
        return refuse(RefusalCode.ek_certificate_mismatch, anchor=path[-1].subject.rfc4514_string())
    return None
