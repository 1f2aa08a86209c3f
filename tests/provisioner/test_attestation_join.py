"""The attested join end to end against real swtpms: the minion builds real messages from its TPM, they
cross a JSON boundary, and the control plane's verifier accepts or refuses them. One test per refusal."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from contracts.errors import Forbidden
from contracts.messages import JoinChallenge, JoinRequest, ProofRequest, QuoteMessage
from minion.join.attest import join_request, parse_challenge, proof_payload, quote_payload
from minion.tpm.session import AttestationKey, TpmSession
from provisioner.attestation.continuous import issue_quote_nonce, quote_due, verify_fresh_quote
from provisioner.attestation.ek_certs import TrustStore
from provisioner.attestation.nonces import LateAnswer, MemoryNonceStore, NonceIssuer
from provisioner.attestation.pcr_policy import ManifestPolicy, PcrPolicy, RecordPolicy
from provisioner.attestation.quote import VerifiedQuote
from provisioner.attestation.refusals import Refusal, RefusalCode
from provisioner.attestation.verifier import Attested, JoinVerifier, RegionTrust
from provisioner.attestation.wire import PendingJoin, quote_evidence
from provisioner.lab.swtpm import Swtpm, VendorCA


class Clock:
    """Injected into the nonce issuer: tests move time instead of sleeping 60 s."""

    def __init__(self) -> None:
        self.now = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def wire(payload: dict[str, Any]) -> Any:
    """Cross the HTTP boundary: everything must survive JSON."""
    return json.loads(json.dumps(payload))


@dataclass
class Node:
    """A minion with its own swtpm and AK."""

    tpm: Swtpm
    session: TpmSession
    ak: AttestationKey

    def request(self, **changes: Any) -> JoinRequest:
        payload = wire(
            join_request(
                self.session,
                self.ak,
                join_token="jt-secret",
                inventory={"gpus": 2},
                requirements={"ok": True},
            )
        )
        payload.update(changes)
        return JoinRequest.model_validate(payload)

    def proof(self, challenge: JoinChallenge) -> ProofRequest:
        minion_challenge = parse_challenge(wire(json.loads(challenge.model_dump_json())))
        return ProofRequest.model_validate(wire(proof_payload(self.session, self.ak, minion_challenge)))


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def verifier(clock: Clock) -> JoinVerifier:
    return JoinVerifier(NonceIssuer(MemoryNonceStore(), clock=clock))


@pytest.fixture
def trust(tpm_vendor_ca: VendorCA) -> RegionTrust:
    return RegionTrust(TrustStore.from_pems(tpm_vendor_ca.certificate_pems()))


def _node(tpm: Swtpm) -> Node:
    session = TpmSession(tpm.tcti)
    session.open()
    return Node(tpm, session, session.create_ak())


@pytest.fixture
def node(swtpm: Swtpm) -> Any:
    n = _node(swtpm)
    yield n
    n.session.close()


@pytest.fixture
def make_node(make_swtpm: Callable[..., Swtpm]) -> Any:
    nodes: list[Node] = []

    def make(ca: VendorCA | None = None) -> Node:
        nodes.append(_node(make_swtpm(ca)))
        return nodes[-1]

    yield make
    for n in nodes:
        n.session.close()


def begin(
    verifier: JoinVerifier, request: JoinRequest, trust: RegionTrust
) -> tuple[JoinChallenge, PendingJoin]:
    result = verifier.begin(request, trust)
    assert not isinstance(result, Refusal), result
    # The pending join is stored between the two calls: make sure it survives that too.
    challenge, pending = result
    return challenge, PendingJoin.model_validate_json(pending.model_dump_json())


def refused(result: object, code: RefusalCode) -> Refusal:
    assert isinstance(result, Refusal), f"expected {code}, got {type(result).__name__}"
    assert result.code == code, result.to_json()
    assert result.message and "{" not in result.message
    return result


# -- success -----------------------------------------------------------------------------------------


def test_join_succeeds_and_records_pcrs(node: Node, verifier: JoinVerifier, trust: RegionTrust) -> None:
    request = node.request()
    challenge, pending = begin(verifier, request, trust)
    assert challenge.pcrs == [0, 1, 2, 3, 4, 5, 6, 7, 11, 12, 14]
    assert challenge.expires_at - verifier.nonces.clock() == timedelta(seconds=60)
    result = verifier.finish(pending, node.proof(challenge), RecordPolicy())
    assert isinstance(result, Attested), result
    assert result.minion_id == request.minion_id == node.session.endorsement_key().minion_id
    assert result.pcrs == node.session.read_pcrs()
    assert result.pcr_record == result.pcrs  # first attestation in record mode: the baseline
    assert result.ak_public == node.ak.public


def test_join_with_matching_manifest(node: Node, verifier: JoinVerifier, trust: RegionTrust) -> None:
    expected = {i: v for i, v in node.session.read_pcrs().items() if i in (4, 11)}
    challenge, pending = begin(verifier, node.request(), trust)
    result = verifier.finish(pending, node.proof(challenge), ManifestPolicy(expected))
    assert isinstance(result, Attested) and result.pcr_record is None


# -- EK and identity refusals ------------------------------------------------------------------------


def test_ek_from_untrusted_ca(
    make_node: Callable[..., Node], untrusted_vendor_ca: VendorCA, verifier: JoinVerifier, trust: RegionTrust
) -> None:
    rogue = make_node(untrusted_vendor_ca)
    refusal = refused(verifier.begin(rogue.request(), trust), RefusalCode.ek_untrusted_ca)
    assert "provision tpm-ca add" in refusal.message
    assert (
        isinstance(refusal.as_error(), Forbidden) and refusal.as_error().code == "attestation_ek_untrusted_ca"
    )


def test_ek_without_certificate_needs_region_opt_in(
    node: Node, verifier: JoinVerifier, trust: RegionTrust
) -> None:
    request = node.request(ek_certificate=None)
    refused(verifier.begin(request, trust), RefusalCode.ek_certificate_missing)
    opted_in = RegionTrust(trust.store, allow_ek_without_certificate=True)
    challenge, pending = begin(verifier, request, opted_in)
    assert isinstance(verifier.finish(pending, node.proof(challenge), RecordPolicy()), Attested)


def test_ek_certificate_of_another_tpm(
    node: Node, make_node: Callable[..., Node], verifier: JoinVerifier, trust: RegionTrust
) -> None:
    other = make_node()
    stolen = base64.b64encode(other.tpm.ek_certificate.read_bytes()).decode()
    refused(verifier.begin(node.request(ek_certificate=stolen), trust), RefusalCode.ek_certificate_mismatch)


def test_ek_not_matching_claimed_minion_id(
    node: Node, make_node: Callable[..., Node], verifier: JoinVerifier, trust: RegionTrust
) -> None:
    other_id = make_node().session.endorsement_key().minion_id
    refusal = refused(verifier.begin(node.request(minion_id=other_id), trust), RefusalCode.minion_id_mismatch)
    assert refusal.detail["claimed"] == other_id
    assert refusal.detail["actual"] == node.session.endorsement_key().minion_id


def test_ak_that_is_not_a_restricted_signing_key(
    node: Node, verifier: JoinVerifier, trust: RegionTrust
) -> None:
    # The EK is a restricted *decryption* key: offering it as the AK must fail.
    request = node.request()
    bad = request.model_copy(update={"ak_public": request.ek_public})
    refused(verifier.begin(bad, trust), RefusalCode.ak_invalid)


# -- credential and quote refusals -------------------------------------------------------------------


def test_wrong_activated_secret(node: Node, verifier: JoinVerifier, trust: RegionTrust) -> None:
    challenge, pending = begin(verifier, node.request(), trust)
    proof = node.proof(challenge)
    wrong = proof.model_copy(update={"activated_secret": bytes(32)})
    refused(verifier.finish(pending, wrong, RecordPolicy()), RefusalCode.wrong_secret)


def test_ak_from_another_tpm_cannot_answer(
    node: Node, make_node: Callable[..., Node], verifier: JoinVerifier, trust: RegionTrust
) -> None:
    """An attacker pairs a genuine EK (node's) with an AK in its own TPM: its TPM cannot activate the
    credential, and the best it can send is a guess."""
    attacker = make_node()
    request = node.request(ak_public=base64.b64encode(attacker.ak.public).decode())
    challenge, pending = begin(verifier, request, trust)
    from minion.tpm.errors import TpmError

    with pytest.raises(TpmError):
        attacker.session.activate_credential(
            attacker.ak, challenge.credential_blob, challenge.encrypted_secret
        )
    quote = QuoteMessage.model_validate(wire(quote_payload(attacker.session, attacker.ak, challenge.nonce)))
    guess = ProofRequest(activated_secret=b"\x00" * 32, quote=quote)
    refused(verifier.finish(pending, guess, RecordPolicy()), RefusalCode.wrong_secret)


def _with_quote(proof: ProofRequest, **changes: Any) -> ProofRequest:
    return proof.model_copy(update={"quote": proof.quote.model_copy(update=changes)})


def _flip(data: bytes, index: int) -> bytes:
    return data[:index] + bytes([data[index] ^ 0x01]) + data[index + 1 :]


@pytest.mark.parametrize(
    ("field", "index", "code"),
    [
        ("attest", -1, RefusalCode.quote_signature_invalid),  # last byte of the PCR digest
        ("attest", 40, RefusalCode.quote_signature_invalid),  # inside extraData (the nonce)
        ("attest", 0, RefusalCode.quote_malformed),  # the TPM_GENERATED magic
        ("signature", -1, RefusalCode.quote_signature_invalid),  # last byte of ECDSA s
        ("signature", 0, RefusalCode.quote_malformed),  # signature algorithm id
    ],
)
def test_quote_with_one_byte_changed(
    node: Node, verifier: JoinVerifier, trust: RegionTrust, field: str, index: int, code: RefusalCode
) -> None:
    challenge, pending = begin(verifier, node.request(), trust)
    proof = node.proof(challenge)
    original = getattr(proof.quote, field)
    tampered = _with_quote(proof, **{field: _flip(original, index % len(original))})
    refused(verifier.finish(pending, tampered, RecordPolicy()), code)


def test_every_single_byte_change_of_a_quote_is_refused(node: Node) -> None:
    """Exhaustive: flip each byte of TPMS_ATTEST and of TPMT_SIGNATURE; none may verify."""
    from provisioner.attestation.quote import QuoteEvidence, verify_quote
    from provisioner.attestation.tpm_structures import parse_public

    nonce = b"N" * 32
    quote = node.session.quote(node.ak, nonce)
    ak = parse_public(node.ak.public)
    assert isinstance(
        verify_quote(ak, QuoteEvidence(quote.attest, quote.signature, quote.pcrs), nonce), VerifiedQuote
    )
    for field in ("attest", "signature"):
        data = getattr(quote, field)
        for i in range(len(data)):
            parts = {"attest": quote.attest, "signature": quote.signature, field: _flip(data, i)}
            result = verify_quote(ak, QuoteEvidence(parts["attest"], parts["signature"], quote.pcrs), nonce)
            assert isinstance(result, Refusal), f"{field} byte {i} flipped still verified"


# -- nonce refusals ----------------------------------------------------------------------------------


def test_replayed_nonce(node: Node, verifier: JoinVerifier, trust: RegionTrust) -> None:
    challenge, pending = begin(verifier, node.request(), trust)
    proof = node.proof(challenge)
    assert isinstance(verifier.finish(pending, proof, RecordPolicy()), Attested)
    refused(verifier.finish(pending, proof, RecordPolicy()), RefusalCode.nonce_replayed)


def test_old_quote_replayed_into_a_new_join(node: Node, verifier: JoinVerifier, trust: RegionTrust) -> None:
    first, first_pending = begin(verifier, node.request(), trust)
    old_proof = node.proof(first)
    assert isinstance(verifier.finish(first_pending, old_proof, RecordPolicy()), Attested)
    second, pending = begin(verifier, node.request(), trust)
    fresh_secret = node.proof(second).activated_secret
    replay = old_proof.model_copy(update={"activated_secret": fresh_secret})
    refused(verifier.finish(pending, replay, RecordPolicy()), RefusalCode.nonce_mismatch)


def test_expired_nonce(node: Node, verifier: JoinVerifier, trust: RegionTrust, clock: Clock) -> None:
    challenge, pending = begin(verifier, node.request(), trust)
    proof = node.proof(challenge)
    clock.advance(61)
    refusal = refused(verifier.finish(pending, proof, RecordPolicy()), RefusalCode.nonce_expired)
    assert "60 s" in refusal.message


def test_nonce_still_valid_at_59_seconds(
    node: Node, verifier: JoinVerifier, trust: RegionTrust, clock: Clock
) -> None:
    challenge, pending = begin(verifier, node.request(), trust)
    proof = node.proof(challenge)
    clock.advance(59)
    assert isinstance(verifier.finish(pending, proof, RecordPolicy()), Attested)


# -- PCR refusals ------------------------------------------------------------------------------------


def test_reported_pcr_values_not_matching_quote(
    node: Node, verifier: JoinVerifier, trust: RegionTrust
) -> None:
    challenge, pending = begin(verifier, node.request(), trust)
    proof = node.proof(challenge)
    lying = dict(proof.quote.pcrs) | {11: b"\x11" * 32}  # fresh swtpm PCRs are all zero
    refused(
        verifier.finish(pending, _with_quote(proof, pcrs=lying), RecordPolicy()),
        RefusalCode.pcr_digest_mismatch,
    )


def test_pcrs_against_a_different_manifest(node: Node, verifier: JoinVerifier, trust: RegionTrust) -> None:
    actual = node.session.read_pcrs()
    manifest = ManifestPolicy({4: actual[4], 11: b"\x11" * 32})
    challenge, pending = begin(verifier, node.request(), trust)
    refusal = refused(
        verifier.finish(pending, node.proof(challenge), manifest), RefusalCode.pcr_manifest_mismatch
    )
    assert refusal.detail["pcrs"] == [11] and "PCR 11" in refusal.message


def test_extended_pcr_against_recorded_values(node: Node, verifier: JoinVerifier, trust: RegionTrust) -> None:
    recorded = node.session.read_pcrs()
    node.session.extend_pcr(14, b"a different shim")
    challenge, pending = begin(verifier, node.request(), trust)
    refusal = refused(
        verifier.finish(pending, node.proof(challenge), RecordPolicy(recorded)), RefusalCode.pcr_changed
    )
    assert refusal.detail["pcrs"] == [14]


def test_quote_missing_required_pcrs(node: Node, clock: Clock, trust: RegionTrust) -> None:
    strict = JoinVerifier(
        NonceIssuer(MemoryNonceStore(), clock=clock), required_pcrs=(0, 1, 2, 3, 4, 5, 6, 7, 11, 12, 14, 16)
    )
    challenge, pending = begin(strict, node.request(), trust)
    proof = node.proof(challenge.model_copy(update={"pcrs": [0, 1, 2, 3, 4, 5, 6, 7, 11, 12, 14]}))
    refused(strict.finish(pending, proof, RecordPolicy()), RefusalCode.pcr_selection_mismatch)


# -- continuous attestation --------------------------------------------------------------------------


def _attested(node: Node, verifier: JoinVerifier, trust: RegionTrust) -> Attested:
    challenge, pending = begin(verifier, node.request(), trust)
    result = verifier.finish(pending, node.proof(challenge), RecordPolicy())
    assert isinstance(result, Attested)
    return result


def _heartbeat_quote(node: Node, nonce: bytes) -> Any:
    return quote_evidence(QuoteMessage.model_validate(wire(quote_payload(node.session, node.ak, nonce))))


def test_continuous_attestation(node: Node, verifier: JoinVerifier, trust: RegionTrust) -> None:
    joined = _attested(node, verifier, trust)
    policy: PcrPolicy = RecordPolicy(joined.pcr_record)
    assert [n for n in range(1, 31) if quote_due(n, every=10)] == [10, 20, 30]

    nonce = issue_quote_nonce(verifier.nonces, "node-1").nonce
    evidence = _heartbeat_quote(node, nonce)
    ok = verify_fresh_quote(verifier.nonces, "node-1", joined.ak_public, nonce, evidence, policy)
    assert isinstance(ok, VerifiedQuote)
    refused(
        verify_fresh_quote(verifier.nonces, "node-1", joined.ak_public, nonce, evidence, policy),
        RefusalCode.nonce_replayed,
    )

    node.session.extend_pcr(12, b"init=/bin/sh")
    nonce = issue_quote_nonce(verifier.nonces, "node-1").nonce
    changed = verify_fresh_quote(
        verifier.nonces, "node-1", joined.ak_public, nonce, _heartbeat_quote(node, nonce), policy
    )
    assert refused(changed, RefusalCode.pcr_changed).detail["pcrs"] == [12]


def test_a_late_heartbeat_quote_is_late_not_refused_unless_it_shows_something_wrong(
    node: Node, verifier: JoinVerifier, trust: RegionTrust, clock: Clock
) -> None:
    """A quote over an expired nonce that verifies is a LateAnswer (no proof, and nothing against the
    node); one that shows a changed PCR is refused as if it were on time; the late nonce is spent all the
    same (a second try is a replay)."""
    joined = _attested(node, verifier, trust)
    policy: PcrPolicy = RecordPolicy(joined.pcr_record)
    nonce = issue_quote_nonce(verifier.nonces, "node-1").nonce
    evidence = _heartbeat_quote(node, nonce)
    clock.advance(61)
    late = verify_fresh_quote(verifier.nonces, "node-1", joined.ak_public, nonce, evidence, policy)
    assert isinstance(late, LateAnswer), late
    assert late.expired.code == RefusalCode.nonce_expired and "1 s past its 60 s lifetime" in late.detail
    refused(
        verify_fresh_quote(verifier.nonces, "node-1", joined.ak_public, nonce, evidence, policy),
        RefusalCode.nonce_replayed,
    )
    # late and tampered: the quote still tells against the node
    node.session.extend_pcr(12, b"init=/bin/sh")
    nonce = issue_quote_nonce(verifier.nonces, "node-1").nonce
    evidence = _heartbeat_quote(node, nonce)
    clock.advance(61)
    changed = verify_fresh_quote(verifier.nonces, "node-1", joined.ak_public, nonce, evidence, policy)
    assert refused(changed, RefusalCode.pcr_changed).detail["pcrs"] == [12]
    # late and by another AK: refused as well
    nonce = issue_quote_nonce(verifier.nonces, "node-1").nonce
    other = quote_evidence(
        QuoteMessage.model_validate(wire(quote_payload(node.session, node.session.create_ak(), nonce)))
    )
    clock.advance(61)
    refused(
        verify_fresh_quote(verifier.nonces, "node-1", joined.ak_public, nonce, other, policy),
        RefusalCode.quote_signature_invalid,
    )


def test_continuous_attestation_with_another_ak(
    node: Node, verifier: JoinVerifier, trust: RegionTrust
) -> None:
    """A node that lost (or swapped) its AK since joining cannot pass: quotes verify only under the
    recorded AK."""
    joined = _attested(node, verifier, trust)
    other_ak = node.session.create_ak()
    nonce = issue_quote_nonce(verifier.nonces, "node-1").nonce
    evidence = quote_evidence(QuoteMessage.model_validate(wire(quote_payload(node.session, other_ak, nonce))))
    refused(
        verify_fresh_quote(
            verifier.nonces, "node-1", joined.ak_public, nonce, evidence, RecordPolicy(joined.pcr_record)
        ),
        RefusalCode.quote_signature_invalid,
    )


def test_heartbeat_nonce_is_bound_to_its_node(node: Node, verifier: JoinVerifier, trust: RegionTrust) -> None:
    joined = _attested(node, verifier, trust)
    nonce = issue_quote_nonce(verifier.nonces, "node-1").nonce
    refused(
        verify_fresh_quote(
            verifier.nonces,
            "node-2",
            joined.ak_public,
            nonce,
            _heartbeat_quote(node, nonce),
            RecordPolicy(joined.pcr_record),
        ),
        RefusalCode.nonce_mismatch,
    )
