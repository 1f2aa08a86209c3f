"""Protocol version 1 on the wire, pinned by examples recorded from the code before the contracts package
existed (tests/contracts/wire_v1/: a real swtpm, a real `provision serve`, the minion's own builders).
An image built before a change must keep joining a control plane built after it, so:

(a) every recorded example parses with the contract's model and re-serializes to the same bytes
    (byte-identical: key order and separators included, as httpx and FastAPI put them on the wire);
(b) the programs' builders still produce exactly the recorded shapes: the minion's join, proof and
    heartbeat bodies (real swtpm, compared by key order and value types, since keys and nonces differ per
    TPM), the control plane's challenge (the in-process verifier), join result and heartbeat answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from contracts import manifest
from contracts.bundle import EnrollmentBundle, read_bundle
from contracts.messages import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinChallenge,
    JoinRequest,
    JoinResult,
    KeyJoinChallenge,
    KeyJoinRequest,
    KeyProofRequest,
    ProofRequest,
)

WIRE = Path(__file__).parent / "wire_v1"


def raw(name: str) -> bytes:
    return (WIRE / name).read_bytes()


def compact(value: Any) -> bytes:
    """What httpx sends for `json=` and FastAPI's JSONResponse answers: compact, UTF-8, no NaN."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


@pytest.mark.parametrize(
    ("name", "model"),
    [
        ("join_request.json", JoinRequest),
        ("join_challenge.json", JoinChallenge),
        ("proof_request.json", ProofRequest),
        ("join_result.json", JoinResult),
        ("join_pending.json", JoinResult),
        ("heartbeat_response.json", HeartbeatResponse),
        ("heartbeat_response_nonce.json", HeartbeatResponse),
        # a device without a TPM (docs/join-protocol.md "Devices without a TPM"), recorded from the
        # minion's DeviceKey and the control plane's KeyJoinVerifier
        ("key_join_request.json", KeyJoinRequest),
        ("key_join_challenge.json", KeyJoinChallenge),
        ("key_proof_request.json", KeyProofRequest),
    ],
)
def test_message_round_trips_byte_identical(name: str, model: type[BaseModel]) -> None:
    expected = raw(name)
    if REMOVED.get(name) or ADDED.get(name):
        # the recorded answer still parses; re-serialized it lacks the removed fields and has the added ones
        # at their defaults
        kept = {k: v for k, v in json.loads(expected).items() if k not in REMOVED.get(name, ())}
        expected = compact(kept | dict.fromkeys(ADDED.get(name, ())))
    assert model.model_validate_json(raw(name)).model_dump_json().encode() == expected


# Fields removed from the control plane's answers since they were recorded, on purpose. Answers are read
# ignoring unknown fields, so a newer minion reads an old control plane's answer, and an old minion
# ignores the field's absence: `ssh_authorized_key` went with the control plane's SSH access to nodes
# (docs/join-protocol.md, "Finalize": the minion runs the playbook itself).
REMOVED: dict[str, frozenset[str]] = {
    "join_result.json": frozenset({"ssh_authorized_key"}),
    "join_pending.json": frozenset({"ssh_authorized_key"}),
}
# Fields added to the control plane's answers since they were recorded, each with a default of None: an
# old minion ignores them, and a newer minion reads an old control plane's answer, which lacks them.
# `desired_revision` names the desired state, so that a minion which echoes it is not sent the same state
# again (docs/join-protocol.md, "Heartbeat"); a minion that never echoes one always gets it whole.
ADDED: dict[str, tuple[str, ...]] = {
    "heartbeat_response.json": ("desired_revision",),
    "heartbeat_response_nonce.json": ("desired_revision",),
}


@pytest.mark.parametrize(
    "name", ["heartbeat_request.json", "heartbeat_request_quote.json", "heartbeat_request_key.json"]
)
def test_heartbeat_request_round_trips_byte_identical(name: str) -> None:
    """Absent fields stay absent (`to_wire`): a beat without a nonce to answer carries no `quote`."""
    assert compact(HeartbeatRequest.model_validate_json(raw(name)).to_wire()) == raw(name)


def test_enrollment_bundle_round_trips_byte_identical() -> None:
    """The file as `provision region bundle` wrote it (indent 2, no trailing newline)."""
    assert read_bundle(WIRE / "enrollment_bundle.json").to_json().encode() == raw("enrollment_bundle.json")


def test_image_manifest_verifies_and_is_canonical() -> None:
    doc = manifest.verify(raw("image_manifest.json"), raw("image_manifest.json.sig"), raw("builder.pub"))
    parsed = manifest.ImageManifest.model_validate(doc)
    assert manifest.canonical(parsed.model_dump(by_alias=True, exclude_unset=True)) == raw(
        "image_manifest.json"
    )
    assert doc["builder"]["key_sha256"] == manifest.public_key_fingerprint(raw("builder.pub"))
    with pytest.raises(manifest.ManifestError, match="altered"):
        manifest.verify(
            raw("image_manifest.json").replace(b"bookworm", b"trixie!!"),
            raw("image_manifest.json.sig"),
            raw("builder.pub"),
        )


# ---------------------------------------------------------------- (b) the builders still make these shapes


def shape(value: Any) -> Any:
    """Key order and value types, recursively (values differ per TPM, per nonce, per run)."""
    if isinstance(value, dict):
        return [(k, shape(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [shape(v) for v in value[:1]]
    return type(value).__name__


def recorded(name: str) -> Any:
    return json.loads(raw(name))


def test_minion_builders_produce_the_recorded_shapes(swtpm: Any, tpm_vendor_ca: Any) -> None:
    from minion.join.attest import join_request, parse_challenge, proof_payload, quote_payload
    from minion.tpm.session import TpmSession
    from provisioner.attestation.ek_certs import TrustStore
    from provisioner.attestation.nonces import MemoryNonceStore, NonceIssuer
    from provisioner.attestation.verifier import JoinVerifier, RegionTrust

    with TpmSession(swtpm.tcti) as session:
        ak = session.create_ak()
        body = join_request(
            session,
            ak,
            join_token="rbj_x",
            inventory={"gpus": []},
            requirements={"ok": True, "rules": [{"rule": "tpm", "ok": True}]},
        )
        assert shape(json.loads(compact(body))) == shape(recorded("join_request.json"))
        # The control plane's answer, from its verifier, has the recorded shape and parses on the minion.
        verifier = JoinVerifier(NonceIssuer(MemoryNonceStore()))
        begun = verifier.begin(
            JoinRequest.model_validate(body),
            RegionTrust(TrustStore.from_pems(tpm_vendor_ca.certificate_pems())),
        )
        assert isinstance(begun, tuple), begun
        challenge = begun[0]
        assert shape(json.loads(challenge.model_dump_json())) == shape(recorded("join_challenge.json"))
        proof = proof_payload(session, ak, parse_challenge(json.loads(challenge.model_dump_json())))
        assert shape(json.loads(compact(proof))) == shape(recorded("proof_request.json"))
        assert list(proof["quote"]["pcrs"]) == list(recorded("proof_request.json")["quote"]["pcrs"])
        quote = quote_payload(session, ak, b"nonce" * 4)
        beat = HeartbeatRequest.model_validate({"actual": {"maintenance": True}, "quote": quote}).to_wire()
        assert shape(beat) == shape(recorded("heartbeat_request_quote.json"))
        assert HeartbeatRequest(actual={"maintenance": True}).to_wire() == recorded("heartbeat_request.json")


def test_control_plane_answers_have_the_recorded_fields() -> None:
    pending = JoinResult(
        state="pending", message="attested; waiting for an operator", heartbeat_interval_s=30
    )
    kept = [k for k in recorded("join_pending.json") if k not in REMOVED["join_pending.json"]]
    assert list(pending.model_dump(mode="json")) == kept
    assert list(JoinResult.model_fields) == [
        k for k in recorded("join_result.json") if k not in REMOVED["join_result.json"]
    ]
    assert list(HeartbeatResponse.model_fields) == [
        *recorded("heartbeat_response.json"),
        *ADDED["heartbeat_response.json"],
    ]
    assert list(EnrollmentBundle.model_fields) == list(recorded("enrollment_bundle.json"))
