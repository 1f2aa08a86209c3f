"""The shared identity rules and the one enrollment-bundle reader and writer (contracts/identity.py,
bundle.py)."""

from __future__ import annotations

import hashlib
import json
import stat
from pathlib import Path

import pytest

from contracts.bundle import REQUIRED_KEYS, BundleError, EnrollmentBundle, read_bundle, write_bundle
from contracts.identity import is_dns_label, is_minion_id, minion_id_from_spki

WIRE = Path(__file__).parent / "wire_v1"


def test_minion_id_is_the_first_32_hex_of_sha256_over_the_spki() -> None:
    assert minion_id_from_spki(b"spki") == hashlib.sha256(b"spki").hexdigest()[:32]
    assert is_minion_id(minion_id_from_spki(b"spki"))


@pytest.mark.parametrize(
    "value",
    ["0123456789abcdef0123456789abcdef\n", "0123456789ABCDEF0123456789abcdef", "0123456789abcdef", ""],
)
def test_malformed_minion_ids_are_refused(value: str) -> None:
    assert not is_minion_id(value)


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("lab", True),
        ("a", True),
        ("gpu-1", True),
        ("a" * 63, True),
        ("lab\n", False),
        ("-lab", False),
        ("lab-", False),
        ("Lab", False),
        ("a" * 64, False),
        ("", False),
        ("a.b", False),
    ],
)
def test_dns_labels(value: str, ok: bool) -> None:
    assert is_dns_label(value) is ok


def test_bundle_write_then_read_is_identical_and_private(tmp_path: Path) -> None:
    bundle = read_bundle(WIRE / "enrollment_bundle.json")
    out = tmp_path / "bundle.json"
    write_bundle(out, bundle)
    assert out.read_bytes() == (WIRE / "enrollment_bundle.json").read_bytes()
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert read_bundle(out) == bundle


@pytest.mark.parametrize("key", REQUIRED_KEYS)
def test_bundle_without_a_required_key_is_refused(tmp_path: Path, key: str) -> None:
    data = json.loads((WIRE / "enrollment_bundle.json").read_text())
    del data[key]
    (tmp_path / "b.json").write_text(json.dumps(data))
    with pytest.raises(BundleError, match=f"missing {key}.*provision region bundle"):
        read_bundle(tmp_path / "b.json")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("{not json", "not JSON"),
        ("42", "not a JSON object"),
        (
            '{"version": 2, "control_plane_url": "u", "region": "r", '
            '"region_id": "i", "provider": "p", "join_token": "t"}',
            "unsupported version 2",
        ),
    ],
)
def test_unusable_bundles_say_why(tmp_path: Path, text: str, reason: str) -> None:
    (tmp_path / "b.json").write_text(text)
    with pytest.raises(BundleError) as caught:
        read_bundle(tmp_path / "b.json")
    assert caught.value.reason == reason and caught.value.code == "invalid_bundle"


def test_unknown_fields_are_ignored() -> None:
    data = json.loads((WIRE / "enrollment_bundle.json").read_text())
    assert EnrollmentBundle.model_validate({**data, "future": 1}) == EnrollmentBundle.model_validate(data)
