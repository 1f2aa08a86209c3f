"""EK certificate chains: does a TPM vendor the operator trusts vouch for this endorsement key?

Why not `cryptography.x509.verification`: that verifier enforces the Web PKI profile (server/client
EKUs, SAN rules), and EK certificates follow the TCG EK Credential Profile instead (critical SAN with a
directoryName of TPM manufacturer OIDs, EKU 2.23.133.8.1, often an empty subject). So the path is built
here from `cryptography`'s primitives: `verify_directly_issued_by` (issuer name + signature), the
validity window, and CA basic constraints on every issuer.

Trust anchors are the CA certificates the operator added (`provision tpm-ca add`); an anchor may be a
vendor root or a vendor intermediate — adding it is the statement of trust. Extra intermediates (from the
TPM vendor's download site) may be given as an untrusted pool used only to build the path.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from cryptography import x509
from cryptography.exceptions import InvalidSignature

MAX_CHAIN_DEPTH = 6


class ChainError(ValueError):
    """The certificate does not chain to a trusted anchor; the message says where it stopped."""


@dataclass(frozen=True)
class TrustStore:
    anchors: tuple[x509.Certificate, ...]
    intermediates: tuple[x509.Certificate, ...] = field(default_factory=tuple)

    @classmethod
    def from_pems(cls, anchors: Iterable[bytes], intermediates: Iterable[bytes] = ()) -> TrustStore:
        """Build from PEM blobs; each blob may hold several certificates."""

        def load(blobs: Iterable[bytes]) -> tuple[x509.Certificate, ...]:
            return tuple(c for blob in blobs for c in x509.load_pem_x509_certificates(blob))

        return cls(load(anchors), load(intermediates))


def load_certificate(data: bytes) -> x509.Certificate:
    """An EK certificate as the minion sends it: DER (what NV holds); PEM accepted for operators."""
    if data.lstrip().startswith(b"-----BEGIN"):
        return x509.load_pem_x509_certificate(data)
    return x509.load_der_x509_certificate(data)


def _issued_by(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def is_ca(cert: x509.Certificate) -> bool:
    """Whether `cert` says it is a CA (BasicConstraints ca=true); no extension means no."""
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def _check_validity(cert: x509.Certificate, now: datetime) -> None:
    if not (cert.not_valid_before_utc <= now <= cert.not_valid_after_utc):
        raise ChainError(f"certificate {cert.subject.rfc4514_string()!r} is outside its validity period")


def verify_chain(
    leaf: x509.Certificate, store: TrustStore, now: datetime | None = None
) -> list[x509.Certificate]:
    """Return the path leaf → anchor, or raise ChainError naming where the path broke."""
    now = now or datetime.now(UTC)
    if not store.anchors:
        raise ChainError("no TPM vendor CA is trusted yet")
    _check_validity(leaf, now)
    path = [leaf]
    current = leaf
    for _ in range(MAX_CHAIN_DEPTH):
        for anchor in store.anchors:
            if _issued_by(current, anchor):
                _check_validity(anchor, now)
                return path + [anchor]
        step = next(
            (c for c in store.intermediates if c not in path and is_ca(c) and _issued_by(current, c)), None
        )
        if step is None:
            break
        _check_validity(step, now)
        path.append(step)
        current = step
    raise ChainError(f"issuer {current.issuer.rfc4514_string()!r} is not a trusted TPM vendor CA")
