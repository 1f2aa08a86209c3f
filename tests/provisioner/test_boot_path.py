"""The boot path behind PCR 4 at the verifier, with real swtpms: the firmware's event log (written by
tests/fixtures/eventlog.py, the TPM's PCR 4 extended with the same digests as the firmware would) goes with
the quote the minion's own builders make, crosses JSON, and the verifier replays it. One test per
refusal (docs/join-protocol.md, "Boot path (PCR 4)"), for the join proof and for continuous attestation.
The HTTP end to end (stored state, `provision node refusals`, errored nodes) is test_boot_path_join.py."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import ValidationError

from contracts.eventlog import MAX_EVENT_LOG_BYTES, EventLogError, parse_event_log, replay
from contracts.messages import ProofRequest, QuoteMessage
from minion.join.attest import parse_challenge as minion_challenge
from minion.join.attest import proof_payload, quote_payload, read_event_log
from provisioner.attestation.boot_path import BootPathPolicy, check_boot_path
from provisioner.attestation.continuous import issue_quote_nonce, verify_fresh_quote
from provisioner.attestation.ek_certs import TrustStore
from provisioner.attestation.nonces import MemoryNonceStore, NonceIssuer
from provisioner.attestation.pcr_policy import RecordPolicy
from provisioner.attestation.quote import VerifiedQuote
from provisioner.attestation.refusals import Refusal, RefusalCode
from provisioner.attestation.verifier import Attested, JoinVerifier, RegionTrust
from provisioner.attestation.wire import quote_evidence
from provisioner.lab.swtpm import Swtpm, VendorCA
from tests.fixtures.eventlog import boot_path_events, extend_digests, write_event_log
from tests.provisioner.test_attestation_join import Node, _node, begin, refused, wire

BOOT = ["5b" * 32, "6c" * 32, "7d" * 32]  # systemd-boot, the UKI, the kernel (Authenticode digests)
MANIFEST = BootPathPolicy(frozenset(BOOT))
LOG = write_event_log(boot_path_events(BOOT))


@pytest.fixture
def booted(swtpm: Swtpm) -> Iterator[Node]:
    """A node whose firmware ran BOOT: PCR 4 holds what LOG says."""
    node = _node(swtpm)
    extend_digests(node.session, boot_path_events(BOOT))
    yield node
    node.session.close()


@pytest.fixture
def verifier() -> JoinVerifier:
    return JoinVerifier(NonceIssuer(MemoryNonceStore()))


@pytest.fixture
def trust(tpm_vendor_ca: VendorCA) -> RegionTrust:
    return RegionTrust(TrustStore.from_pems(tpm_vendor_ca.certificate_pems()))


def _join(
    node: Node, verifier: JoinVerifier, trust: RegionTrust, log: bytes | None, boot: BootPathPolicy
) -> Any:
    challenge, pending = begin(verifier, node.request(), trust)
    parsed = minion_challenge(wire(challenge.model_dump(mode="json")))
    proof = ProofRequest.model_validate(wire(proof_payload(node.session, node.ak, parsed, log)))
    return verifier.finish(pending, proof, RecordPolicy(), boot)


def test_the_fixture_log_replays_to_the_tpms_pcr4(booted: Node) -> None:
    assert replay(parse_event_log(LOG), 4) == booted.session.read_pcrs([4])[4].hex()


def test_matching_log_and_manifest_joins(booted: Node, verifier: JoinVerifier, trust: RegionTrust) -> None:
    assert isinstance(_join(booted, verifier, trust, LOG, MANIFEST), Attested)


def test_without_manifests_a_log_is_optional_but_must_replay(
    booted: Node, verifier: JoinVerifier, trust: RegionTrust
) -> None:
    assert isinstance(_join(booted, verifier, trust, None, BootPathPolicy()), Attested)  # old minions
    assert isinstance(_join(booted, verifier, trust, LOG, BootPathPolicy()), Attested)
    other = write_event_log(boot_path_events(BOOT[:2]))
    refused(_join(booted, verifier, trust, other, BootPathPolicy()), RefusalCode.event_log_mismatch)


def test_log_not_replaying_to_the_quote(booted: Node, verifier: JoinVerifier, trust: RegionTrust) -> None:
    """A log of another boot (one application fewer) with the manifest's digests: PCR 4 says otherwise."""
    other = write_event_log(boot_path_events(BOOT[:2]))
    refusal = refused(_join(booted, verifier, trust, other, MANIFEST), RefusalCode.event_log_mismatch)
    assert "PCR 4" in refusal.message and "\n" not in refusal.message


def test_unknown_boot_application(swtpm: Swtpm, verifier: JoinVerifier, trust: RegionTrust) -> None:
    """The log replays (the firmware really ran it) but one application is not the manifest's."""
    stranger = "e0" * 32
    node = _node(swtpm)
    try:
        events = boot_path_events([BOOT[0], stranger, BOOT[2]])
        extend_digests(node.session, events)
        refusal = refused(
            _join(node, verifier, trust, write_event_log(events), MANIFEST),
            RefusalCode.unknown_boot_application,
        )
        assert stranger in refusal.message and refusal.detail["digests"] == [stranger]
    finally:
        node.session.close()


def test_manifest_region_needs_a_log(booted: Node, verifier: JoinVerifier, trust: RegionTrust) -> None:
    refused(_join(booted, verifier, trust, None, MANIFEST), RefusalCode.no_event_log)


def test_continuous_attestation_with_a_tampered_log(
    booted: Node, verifier: JoinVerifier, trust: RegionTrust
) -> None:
    joined = _join(booted, verifier, trust, LOG, MANIFEST)
    assert isinstance(joined, Attested)
    policy = RecordPolicy(joined.pcr_record)

    def fresh(log: bytes | None) -> VerifiedQuote | Refusal:
        nonce = issue_quote_nonce(verifier.nonces, "node-1").nonce
        message = QuoteMessage.model_validate(
            wire(quote_payload(booted.session, booted.ak, nonce, event_log=log))
        )
        return verify_fresh_quote(
            verifier.nonces, "node-1", joined.ak_public, nonce, quote_evidence(message), policy, boot=MANIFEST
        )

    assert isinstance(fresh(LOG), VerifiedQuote)
    # the kernel's digest swapped in the log (a different kernel claimed): no longer replays
    tampered = LOG.replace(bytes.fromhex(BOOT[2]), bytes.fromhex("e0" * 32))
    refused(fresh(tampered), RefusalCode.event_log_mismatch)
    refused(fresh(None), RefusalCode.no_event_log)


# ---------------------------------------------------------------- the log is untrusted input


@pytest.mark.parametrize(
    "blob",
    [
        b"",
        b"\0" * 31,
        LOG[:40],  # inside the Spec ID event
        LOG[:-5],  # inside the last event's data
        LOG[: len(LOG) - 40],  # inside a digest
        LOG.replace(b"Spec ID Event03", b"Spec ID Event02"),
        LOG + struct.pack("<III", 4, 3, 99),  # more digests than banks
    ],
)
def test_malformed_logs_are_refused_not_crashed_on(blob: bytes) -> None:
    with pytest.raises(EventLogError):
        parse_event_log(blob)
    refusal = check_boot_path(blob, {4: bytes(32)}, MANIFEST)
    assert refusal is not None and refusal.code == RefusalCode.event_log_mismatch


def test_every_truncation_of_a_log_is_handled() -> None:
    for n in range(len(LOG)):
        try:
            parse_event_log(LOG[:n])
        except EventLogError:
            continue


def test_wire_bound_and_what_the_minion_reads(tmp_path: Any) -> None:
    quote = {"attest": "", "signature": "", "pcrs": {}}
    with pytest.raises(ValidationError, match="event log may have"):
        QuoteMessage.model_validate({**quote, "event_log": b"\0" * (MAX_EVENT_LOG_BYTES + 1)})
    assert "event_log" not in QuoteMessage.model_validate(quote).model_dump(mode="json")
    assert read_event_log(tmp_path / "missing") is None  # the lab's swtpm nodes have none
    (tmp_path / "empty").write_bytes(b"")
    (tmp_path / "log").write_bytes(LOG)
    (tmp_path / "huge").write_bytes(b"\0" * (MAX_EVENT_LOG_BYTES + 1))
    assert read_event_log(tmp_path / "empty") is None and read_event_log(tmp_path / "huge") is None
    assert read_event_log(tmp_path / "log") == LOG


def test_migration_keeps_registered_manifests_pe_hashes(tmp_path: Any) -> None:
    """0009 drops --pin-pcr4's column and copies each registered manifest's pe_hashes into its row (and
    back down again). A bare SQLite engine: foreign keys are not enforced, so the row needs no region."""
    import sqlalchemy as sa
    from alembic import command

    from provisioner.store.migrate import alembic_config

    url = f"sqlite:///{tmp_path / 'store.db'}"
    engine = sa.create_engine(url)
    cfg = alembic_config(url)

    def migrate(step: Any, target: str) -> None:
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            step(cfg, target)

    def columns() -> set[str]:
        return {c["name"] for c in sa.inspect(engine).get_columns("image_manifests")}

    migrate(command.upgrade, "0008_finalize_on_node")
    doc = '{"pe_hashes":{"uki":"' + "6c" * 32 + '","kernel":"' + "7d" * 32 + '"}}'
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO image_manifests (id, region_id, key_id, manifest_sha256, manifest, signature, "
                "image_sha256, uki_sha256, verity_root_hash, pcr11, pcr12, pcr4, pin_pcr4, packages, "
                "created_at, created_by) VALUES ('img_1', 'r', 'k', 's', :doc, 'sig', 'i', 'u', 'v', "
                "'p11', 'p12', NULL, 1, 0, CURRENT_TIMESTAMP, 'operator:test')"
            ),
            {"doc": doc},
        )
    migrate(command.upgrade, "0009_boot_path_event_log")
    assert "pin_pcr4" not in columns()
    with engine.connect() as conn:
        stored = conn.execute(sa.text("SELECT pe_hashes FROM image_manifests")).scalar_one()
    assert json.loads(stored) == ["6c" * 32, "7d" * 32]
    migrate(command.downgrade, "0008_finalize_on_node")
    assert "pin_pcr4" in columns() and "pe_hashes" not in columns()
    engine.dispose()
