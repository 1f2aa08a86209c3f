"""Image manifests on the control plane, service level, on SQLite AND PostgreSQL (`store` is
parametrized): trusting builder keys, registering signed manifests, refusals that leave no partial
state, and the PCR policy a region with manifests gives the join verifier. Manifests are signed with
keys from the image builder's own `keygen`/`sign`/`canonical` (image_builder.manifest)."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from sqlalchemy.orm import Session

from contracts.errors import Conflict, InvalidInput, NotFound, RigbaseError, RuleViolation
from provisioner.attestation.boot_path import BootPathPolicy
from provisioner.attestation.refusals import RefusalCode
from provisioner.services.fleet import images
from provisioner.services.fleet.join import pcr_policy_for
from provisioner.services.regions import providers, regions
from tests.fixtures.manifests import ZERO, Builder
from tests.fixtures.postgres import Store

ACTOR = "operator:test"


@pytest.fixture
def builder(tmp_path: Path) -> Builder:
    return Builder(tmp_path / "builder")


@pytest.fixture
def other_builder(tmp_path: Path) -> Builder:
    return Builder(tmp_path / "other-builder")


@pytest.fixture
def seeded(store: Store) -> Store:
    with store.sessions.begin() as s:  # type: ignore[attr-defined]
        providers.enable(s, "physical", {}, actor=ACTOR)
        regions.create(s, "lab", provider="physical", actor=ACTOR)
        regions.create(s, "other", provider="physical", actor=ACTOR)
    return store


def _session(store: Store) -> Session:
    return store.sessions.begin()  # type: ignore[attr-defined, no-any-return]


def test_trust_key_and_register(seeded: Store, builder: Builder) -> None:
    with _session(seeded) as s:
        key = images.trust_key(s, builder.public, name="ci-builder", actor=ACTOR)
        assert key.fingerprint == builder.fingerprint and key.id.startswith("ikey_")
        # the fingerprint is the identity: trusting the same key again (as raw bytes) changes nothing
        raw = serialization.load_pem_public_key(builder.public).public_bytes_raw()  # type: ignore[union-attr]
        assert images.trust_key(s, raw, name="again", actor=ACTOR).id == key.id
        assert images.trust_key(s, base64.b64encode(raw), name="again", actor=ACTOR).id == key.id
        assert [k.name for k in images.list_keys(s)] == ["ci-builder"]
    data, sig = builder.signed(builder.manifest(pcr11="c" * 64, pcr12="d" * 64))
    with _session(seeded) as s:
        row = images.register(s, data, sig, actor=ACTOR)
        assert row.region.name == "lab" and row.manifest_sha256 == hashlib.sha256(data).hexdigest()
        assert (row.pcr11, row.pcr12, row.verity_root_hash) == ("c" * 64, "d" * 64, "3" * 64)
        assert images.manifest_document(row)["pcr12"]["sha256"] == "d" * 64
        lab = regions.get(s, "lab")
        # PCR 11 (sysinit:ready) and PCR 12 only: PCR 4 depends on the firmware boot path
        assert images.manifest_pcr_sets(s, lab) == [
            {11: bytes.fromhex("c" * 64), 12: bytes.fromhex("d" * 64)}
        ]
        assert images.manifest_pcr_sets(s, regions.get(s, "other")) == []
        assert [m.id for m in images.list_manifests(s, "lab")] == [row.id]
        assert images.get_manifest(s, row.manifest_sha256[:10]).id == row.id
    with _session(seeded) as s, pytest.raises(Conflict):
        images.register(s, data, sig, actor=ACTOR)  # the same manifest twice in one region


@pytest.mark.parametrize(
    "case",
    [
        "unsigned",
        "tampered",
        "untrusted",
        "garbage_signature",
        "region_mismatch",
        "no_region",
        "incomplete",
        "no_pe_hashes",
        "no_key_trusted",
    ],
)
def test_refused_manifests_leave_no_state(
    seeded: Store, builder: Builder, other_builder: Builder, case: str
) -> None:
    if case != "no_key_trusted":
        with _session(seeded) as s:
            images.trust_key(s, builder.public, name="ci-builder", actor=ACTOR)
    doc = builder.manifest()
    data, sig = builder.signed(doc)
    region: str | None = None
    expected: type[RigbaseError] = RuleViolation
    if case == "unsigned":
        sig = b""
    elif case == "tampered":  # one predicted PCR changed after signing
        data = data.replace(ZERO.encode(), ("f" * 64).encode(), 1)
    elif case == "untrusted":
        data, sig = other_builder.signed(other_builder.manifest())
    elif case == "garbage_signature":
        sig = b"not base64!\n"
    elif case == "region_mismatch":
        region, expected = "other", InvalidInput
    elif case == "no_region":
        data, sig = builder.signed(builder.manifest(region=None))
        expected = InvalidInput
    elif case == "incomplete":
        del doc["pcr12"]
        data, sig = builder.signed(doc)
        expected = InvalidInput
    elif case == "no_pe_hashes":  # joins could not check the boot path
        doc["pe_hashes"] = {"uki": "not hex"}
        data, sig = builder.signed(doc)
        expected = InvalidInput
    before = seeded.snapshot()
    with _session(seeded) as s, pytest.raises(expected) as err:
        images.register(s, data, sig, region=region, actor=ACTOR)
    assert "\n" not in err.value.message and err.value.message.strip()
    assert seeded.snapshot() == before


def test_register_with_region_option_and_unknown_region(seeded: Store, builder: Builder) -> None:
    with _session(seeded) as s:
        images.trust_key(s, builder.public, name=None, actor=ACTOR)
    data, sig = builder.signed(builder.manifest(region="elsewhere"))
    before = seeded.snapshot()
    with _session(seeded) as s, pytest.raises(InvalidInput, match="pass --region"):
        images.register(s, data, sig, actor=ACTOR)
    with _session(seeded) as s, pytest.raises(NotFound):
        images.register(s, data, sig, region="nowhere", actor=ACTOR)
    assert seeded.snapshot() == before
    with _session(seeded) as s:
        assert images.register(s, data, sig, region="other", actor=ACTOR).region.name == "other"


def test_bad_public_keys_refused(seeded: Store, builder: Builder) -> None:
    before = seeded.snapshot()
    for bad in (b"", b"hello", builder.private_path.read_bytes()):
        with _session(seeded) as s, pytest.raises(InvalidInput):
            images.trust_key(s, bad, name=None, actor=ACTOR)
    assert seeded.snapshot() == before


def test_rollout_policy_and_boot_path(seeded: Store, builder: Builder) -> None:
    a, b, c = (bytes([n]) * 32 for n in (1, 2, 3))
    with _session(seeded) as s:
        images.trust_key(s, builder.public, name=None, actor=ACTOR)
        lab = regions.get(s, "lab")
        assert pcr_policy_for(s, lab).mode.value == "record"  # nothing registered yet
        assert images.boot_path_policy_for(s, lab) == BootPathPolicy()  # a log is optional
        images.register(s, *builder.signed(builder.manifest(pcr11=a.hex(), pcr12=ZERO)), actor=ACTOR)
        images.register(
            s,
            *builder.signed(
                builder.manifest(pcr11=b.hex(), pcr12=ZERO, image="e" * 64, pe_hashes={"uki": "d" * 64})
            ),
            actor=ACTOR,
        )
        policy = pcr_policy_for(s, lab)
        assert policy.mode.value == "manifest"
        zero = bytes(32)
        # PCR 4 is never compared with one value (the event log's boot path is checked instead)
        assert policy.check({11: a, 12: zero, 4: c}).ok and policy.check({11: b, 12: zero}).ok
        refused = policy.check({11: c, 12: zero})
        assert refused.refusal is not None and refused.refusal.code == RefusalCode.pcr_manifest_mismatch
        assert refused.differing == (11,)
        assert policy.check({11: a, 12: c}).differing == (12,)  # the closest manifest is named
        # the boot path: any registered manifest's EFI applications may run (a rollout)
        assert images.boot_path_policy_for(s, lab).pe_hashes == {"5" * 64, "6" * 64, "7" * 64, "d" * 64}
        assert images.boot_path_policy_for(s, regions.get(s, "other")).pe_hashes is None


def test_untrust_key_with_manifests(seeded: Store, builder: Builder) -> None:
    with _session(seeded) as s:
        key = images.trust_key(s, builder.public, name="ci-builder", actor=ACTOR)
        images.register(s, *builder.signed(builder.manifest()), actor=ACTOR)
    before = seeded.snapshot()
    with _session(seeded) as s, pytest.raises(RuleViolation, match="--force"):
        images.untrust_key(s, "ci-builder", actor=ACTOR)
    assert seeded.snapshot() == before
    with _session(seeded) as s:
        removed_key, removed = images.untrust_key(s, key.fingerprint[:12], force=True, actor=ACTOR)
        assert removed_key.id == key.id and len(removed) == 1
        assert images.list_keys(s) == [] and images.list_manifests(s) == []
        assert pcr_policy_for(s, regions.get(s, "lab")).mode.value == "record"
