"""Attestation rules that need no TPM: nonce lifetimes, PCR policies, certificate paths, strict parsing,
refusal texts, the wire format's validation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID
from pydantic import ValidationError

from contracts.errors import Conflict, Forbidden, InvalidInput
from contracts.messages import JoinRequest
from provisioner.attestation.ek_certs import ChainError, TrustStore, verify_chain
from provisioner.attestation.nonces import MemoryNonceStore, NonceIssuer
from provisioner.attestation.pcr_policy import ManifestPolicy, RecordPolicy
from provisioner.attestation.refusals import MESSAGES, Refusal, RefusalCode
from provisioner.attestation.tpm_structures import MalformedStructure, parse_quote, parse_signature

T0 = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def test_nonce_lifecycle() -> None:
    clock = Clock()
    issuer = NonceIssuer(MemoryNonceStore(), clock=clock)
    first = issuer.issue("join:a")
    assert len(first.nonce) == 32 and first.expires_at == T0 + timedelta(seconds=60)
    assert issuer.redeem(first.nonce, "join:a") is None
    assert issuer.redeem(first.nonce, "join:a").code == RefusalCode.nonce_replayed
    assert issuer.redeem(b"never issued", "join:a").code == RefusalCode.nonce_unknown
    other = issuer.issue("join:b")
    assert issuer.redeem(other.nonce, "join:a").code == RefusalCode.nonce_mismatch
    # A refused redemption still spends the nonce: one try per nonce.
    assert issuer.redeem(other.nonce, "join:b").code == RefusalCode.nonce_replayed


def test_nonce_expiry_boundary_and_purge() -> None:
    clock = Clock()
    store = MemoryNonceStore()
    issuer = NonceIssuer(store, clock=clock)
    at_limit, late = issuer.issue("s"), issuer.issue("s")
    clock.now = T0 + timedelta(seconds=60)
    assert issuer.redeem(at_limit.nonce, "s") is None
    clock.now = T0 + timedelta(seconds=60, microseconds=1)
    assert issuer.redeem(late.nonce, "s").code == RefusalCode.nonce_expired
    assert store.purge(T0 + timedelta(seconds=61)) == 2
    assert issuer.redeem(late.nonce, "s").code == RefusalCode.nonce_unknown


def test_pcr_policies() -> None:
    values = {0: b"\x00" * 32, 11: b"\x0b" * 32}
    assert ManifestPolicy({11: b"\x0b" * 32}).check(values).ok
    bad = ManifestPolicy({0: b"\x00" * 32, 11: b"\xff" * 32}).check(values)
    assert bad.refusal.code == RefusalCode.pcr_manifest_mismatch and bad.differing == (11,)
    first = RecordPolicy().check(values)
    assert first.ok and first.record == values
    assert RecordPolicy(values).check(values).ok and RecordPolicy(values).check(values).record is None
    changed = RecordPolicy(values).check({**values, 0: b"\x01" * 32})
    assert changed.refusal.code == RefusalCode.pcr_changed and "PCR 0" in changed.refusal.message


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(subject: str, key, issuer: str, signer, *, ca: bool, days: int = 365) -> x509.Certificate:
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(T0 - timedelta(days=1))
        .not_valid_after(T0 + timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .sign(signer, hashes.SHA256())
    )


@pytest.fixture(scope="module")
def pki() -> dict[str, x509.Certificate]:
    root_key, mid_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ek_key = rsa.generate_private_key(65537, 2048)
    root = _cert("Vendor Root", root_key, "Vendor Root", root_key, ca=True)
    mid = _cert("Vendor EK CA", mid_key, "Vendor Root", root_key, ca=True)
    leaf = _cert("unknown", ek_key, "Vendor EK CA", mid_key, ca=False)
    not_ca = _cert("Vendor EK CA", mid_key, "Vendor Root", root_key, ca=False)
    return {"root": root, "mid": mid, "leaf": leaf, "not_ca": not_ca}


def test_chain_through_intermediate_pool(pki: dict[str, x509.Certificate]) -> None:
    store = TrustStore((pki["root"],), (pki["mid"],))
    assert verify_chain(pki["leaf"], store, T0) == [pki["leaf"], pki["mid"], pki["root"]]
    pem = pki["root"].public_bytes(serialization.Encoding.PEM)
    assert TrustStore.from_pems([pem]).anchors == (pki["root"],)


def test_chain_failures(pki: dict[str, x509.Certificate]) -> None:
    with pytest.raises(ChainError, match="not a trusted TPM vendor CA"):
        verify_chain(pki["leaf"], TrustStore((pki["root"],)), T0)  # intermediate unknown
    with pytest.raises(ChainError, match="not a trusted"):
        verify_chain(pki["leaf"], TrustStore((pki["root"],), (pki["not_ca"],)), T0)  # issuer is no CA
    with pytest.raises(ChainError, match="validity"):
        verify_chain(pki["leaf"], TrustStore((pki["mid"],)), T0 + timedelta(days=400))
    with pytest.raises(ChainError, match="no TPM vendor CA"):
        verify_chain(pki["leaf"], TrustStore(()), T0)


def test_parsers_are_strict() -> None:
    with pytest.raises(MalformedStructure, match="magic"):
        parse_quote(b"\x00" * 80)
    with pytest.raises(MalformedStructure, match="truncated"):
        parse_quote(bytes.fromhex("ff544347 8018"))
    sig = bytes.fromhex("0018 000b 0001 aa 0001 bb")
    assert parse_signature(sig).ecc_s == b"\xbb"
    with pytest.raises(MalformedStructure, match="trailing"):
        parse_signature(sig + b"\x00")


def test_every_refusal_has_an_actionable_message() -> None:
    assert set(MESSAGES) == set(RefusalCode)
    for code in RefusalCode:
        refusal = Refusal(code, {"summary": "detail"})
        assert refusal.message.endswith(".") and "{" not in refusal.message
        error = refusal.as_error()
        assert error.code == code.value
        expected = {RefusalCode.malformed_request: InvalidInput, RefusalCode.nonce_expired: Conflict}
        assert isinstance(error, expected.get(code, Forbidden))


def test_wire_rejects_bad_fields() -> None:
    good = {"minion_id": "0" * 32, "ek_public": "AAE=", "ak_public": "AAE=", "join_token": "t"}
    assert JoinRequest.model_validate(good).ek_public == b"\x00\x01"
    for bad in ({"minion_id": "XYZ"}, {"ek_public": "not base64!"}, {"join_token": ""}, {"surprise": 1}):
        with pytest.raises(ValidationError):
            JoinRequest.model_validate(good | bad)
