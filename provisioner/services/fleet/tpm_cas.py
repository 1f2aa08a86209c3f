"""Trusted TPM vendor CAs (`provision tpm-ca add|list|remove`): the trust anchors EK certificates must
chain to. Adding a certificate is the operator's statement of trust, so roots and intermediates are
both accepted as anchors (provisioner/attestation/ek_certs.py)."""

from __future__ import annotations

import hashlib

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from sqlalchemy import select
from sqlalchemy.orm import Session

from contracts.errors import InvalidInput, NotFound
from provisioner.attestation.ek_certs import TrustStore, is_ca
from provisioner.domain.states import TRUST_TRANSITIONS, TrustState
from provisioner.services.common import lifecycle
from provisioner.store.join_models import TpmVendorCa

KIND = "tpm_ca"


def add(session: Session, pem: bytes, *, actor: str) -> list[TpmVendorCa]:
    """Add every CA certificate in `pem` (already trusted ones are returned as they are)."""
    try:
        certs = x509.load_pem_x509_certificates(pem)
    except ValueError as exc:
        raise InvalidInput(
            f"the file holds no PEM certificate ({exc}): pass the vendor's CA certificate in PEM"
        ) from None
    added: list[TpmVendorCa] = []
    for cert in certs:
        if not is_ca(cert):
            raise InvalidInput(
                f"certificate '{cert.subject.rfc4514_string()}' is not a CA (no basicConstraints CA:TRUE): "
                "pass the vendor's root or intermediate CA, not an EK certificate"
            )
        der = cert.public_bytes(Encoding.DER)
        sha = hashlib.sha256(der).hexdigest()
        row = session.scalar(select(TpmVendorCa).where(TpmVendorCa.sha256 == sha))
        if row is None:
            row = TpmVendorCa(
                subject=cert.subject.rfc4514_string() or "(empty subject)",
                sha256=sha,
                pem=cert.public_bytes(Encoding.PEM).decode(),
                not_after=cert.not_valid_after_utc,
            )
            session.add(row)
            session.flush()
            lifecycle.record(
                session,
                kind=KIND,
                resource_id=row.id,
                name=row.subject[:128],
                actor=actor,
                table=TRUST_TRANSITIONS,
                frm=None,
                to=TrustState.TRUSTED,
                reason=f"sha256 {sha}",
            )
        added.append(row)
    return added


def list_all(session: Session) -> list[TpmVendorCa]:
    return list(session.scalars(select(TpmVendorCa).order_by(TpmVendorCa.created_at)))


def remove(session: Session, ref: str, *, actor: str) -> TpmVendorCa:
    """By id or by (a unique prefix of at least 8 characters of) the certificate's SHA-256."""
    rows = [
        r for r in list_all(session) if r.id == ref or (len(ref) >= 8 and r.sha256.startswith(ref.lower()))
    ]
    if len(rows) != 1:
        raise NotFound(
            f"no single trusted TPM CA matches '{ref}': see `provision tpm-ca list`", code="tpm_ca_not_found"
        )
    row = rows[0]
    lifecycle.record(
        session,
        kind=KIND,
        resource_id=row.id,
        name=row.subject[:128],
        actor=actor,
        table=TRUST_TRANSITIONS,
        frm=TrustState.TRUSTED,
        to=TrustState.REMOVED,
        reason="removed by operator",
    )
    session.delete(row)
    session.flush()
    return row


def trust_store(session: Session) -> TrustStore:
    return TrustStore.from_pems([r.pem.encode() for r in list_all(session)])
