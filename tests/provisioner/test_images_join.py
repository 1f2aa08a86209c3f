"""Image manifests end to end, on SQLite AND PostgreSQL: a real `provision serve`, the real `provision image`
CLI, manifests signed with image_builder.manifest keys, and joins from real swtpms driven with the
minion's own message builders (as in test_join_http.py). A node whose PCR 11/12 equal the registered
manifest joins; one whose PCR 11 differs (another UKI) is refused with the manifest-mismatch refusal and
an audit entry — until a second manifest (a rollout) predicts its values."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from provisioner.lab.swtpm import Swtpm, VendorCA
from provisioner.store.engine import make_engine
from tests.fixtures.control_plane import ControlPlane, start_control_plane
from tests.fixtures.eventlog import boot_path_events, extend_digests, write_event_log
from tests.fixtures.manifests import Builder
from tests.fixtures.postgres import Store
from tests.provisioner.test_join_http import Minion, api

MISMATCH = "attestation_pcr_manifest_mismatch"


@pytest.fixture
def cp(database_url: str, tmp_path: Path, tpm_vendor_ca: VendorCA) -> Iterator[ControlPlane]:
    with start_control_plane(tmp_path / "home", database_url) as server:
        ca_file = tmp_path / "vendor.pem"
        ca_file.write_bytes(b"".join(tpm_vendor_ca.certificate_pems()))
        api(server, "POST", "/v1/providers", {"kind": "physical", "config": {}})
        api(server, "POST", "/v1/regions", {"name": "lab", "provider": "physical"})
        api(server, "POST", "/v1/tpm-cas", {"pem": ca_file.read_text()})
        yield server


def run(cp: ControlPlane, *args: str, rc: int = 0) -> subprocess.CompletedProcess[str]:
    out = cp.provision(*args)
    assert out.returncode == rc, (out.stdout, out.stderr)
    return out


def snapshot(cp: ControlPlane) -> dict[str, list[tuple[object, ...]]]:
    engine = make_engine(cp.database_url)
    try:
        return Store(cp.database_url, engine, None).snapshot()
    finally:
        engine.dispose()


def join(m: Minion, token: str) -> Any:
    first = m.begin(token)
    assert first.status_code == 201, first.text
    return m.prove(first.json(), token)


def test_register_and_join_against_manifest(cp: ControlPlane, tmp_path: Path, make_swtpm: Any) -> None:  # noqa: PLR0915
    builder, stranger = Builder(tmp_path / "builder"), Builder(tmp_path / "stranger")
    good_tpm: Swtpm = make_swtpm()
    bad_tpm: Swtpm = make_swtpm()
    good, bad = Minion(good_tpm, cp.url), Minion(bad_tpm, cp.url)
    try:
        # Both firmwares ran the manifests' EFI applications and their minions send that event log
        # (the boot path itself: test_boot_path_join.py).
        for m in (good, bad):
            events = boot_path_events(list(builder.manifest()["pe_hashes"].values()))
            extend_digests(m.session, events)
            m.event_log = write_event_log(events)
        # The "other UKI": PCR 11 of the second node carries one more measurement.
        bad.session.extend_pcr(11, b"a different UKI section")
        good_pcrs, bad_pcrs = good.session.read_pcrs([11, 12]), bad.session.read_pcrs([11, 12])
        assert good_pcrs[11] != bad_pcrs[11] and good_pcrs[12] == bad_pcrs[12]
        expected = builder.write(
            tmp_path / "out", builder.manifest(pcr11=good_pcrs[11].hex(), pcr12=good_pcrs[12].hex())
        )

        # Refusals before anything is trusted or with a bad manifest: exit 1, one line, nothing stored.
        before = snapshot(cp)
        refused = run(cp, "image", "register", str(expected), rc=1)  # no key trusted yet
        assert refused.stderr.startswith("error: ") and refused.stderr.count("\n") == 1
        key_out = run(
            cp, "image", "trust-key", str(builder.public_path), "--name", "ci-builder"
        ).stdout.split()
        assert key_out[1] == builder.fingerprint and key_out[0].startswith("ikey_")
        after_key = snapshot(cp)
        assert after_key != before
        tampered = tmp_path / "tampered" / "manifest.json"
        tampered.parent.mkdir()
        tampered.write_bytes(
            expected.read_bytes().replace(good_pcrs[11].hex().encode(), bad_pcrs[11].hex().encode())
        )
        (tmp_path / "tampered" / "manifest.json.sig").write_bytes(
            (tmp_path / "out" / "manifest.json.sig").read_bytes()
        )
        foreign = stranger.write(tmp_path / "foreign", stranger.manifest(pcr11=bad_pcrs[11].hex()))
        unsigned = tmp_path / "unsigned" / "manifest.json"
        unsigned.parent.mkdir()
        unsigned.write_bytes(expected.read_bytes())
        for path, words in (
            (tampered, "does not verify"),
            (foreign, "not signed by a trusted"),
            (unsigned, "unsigned manifest is never registered"),
        ):
            out = run(cp, "image", "register", str(path), rc=1)
            assert words in out.stderr and out.stderr.count("\n") == 1, out.stderr
        assert snapshot(cp) == after_key

        # Register the real one; the region now checks joins against it.
        image_id = run(cp, "image", "register", str(expected)).stdout.strip()
        assert image_id.startswith("img_")
        listed = json.loads(run(cp, "image", "list", "--json").stdout)
        assert [(i["id"], i["region"], i["checked_pcrs"]) for i in listed] == [(image_id, "lab", [11, 12])]
        shown = json.loads(run(cp, "image", "show", image_id, "--json").stdout)
        assert shown["pcr11"] == good_pcrs[11].hex() and shown["manifest"]["verity"]["root_hash"] == "3" * 64

        token = api(cp, "POST", "/v1/regions/lab/join-tokens", {"ttl": "1h"})["token"]
        api(cp, "POST", "/v1/nodes", {"name": "gpu-good", "region": "lab", "minion_id": good.minion_id})
        api(cp, "POST", "/v1/nodes", {"name": "gpu-bad", "region": "lab", "minion_id": bad.minion_id})
        ok = join(good, token)
        assert ok.status_code == 200 and ok.json()["state"] == "provisioning", ok.text
        history = api(cp, "GET", "/v1/nodes/gpu-good/history")
        assert any("manifest policy" in (e.get("reason") or "") for e in history["items"]), history

        no = join(bad, token)
        assert no.status_code in (403, 422) and no.json()["code"] == MISMATCH, no.text
        assert "PCR 11" in no.json()["message"] and "image manifest" in no.json()["message"]
        audit = api(cp, "GET", f"/v1/join-refusals?minion_id={bad.minion_id}")["items"]
        assert MISMATCH in audit[0]["reason"] and "lab" in audit[0]["reason"]
        assert api(cp, "GET", "/v1/nodes/gpu-bad")["state"] == "errored"

        # A rollout: a second manifest predicting the other UKI's PCR 11 lets that node join.
        second = builder.write(
            tmp_path / "out2",
            builder.manifest(pcr11=bad_pcrs[11].hex(), pcr12=bad_pcrs[12].hex(), image="e" * 64),
        )
        run(cp, "image", "register", str(second), "--region", "lab")
        run(cp, "node", "retry", "gpu-bad")
        again = join(bad, token)
        assert again.status_code == 200 and again.json()["state"] == "provisioning", again.text

        # Untrusting the key is refused while its manifests are registered; --force removes them too.
        out = run(cp, "image", "untrust-key", "ci-builder", "--yes", rc=1)
        assert "--force" in out.stderr
        run(cp, "image", "untrust-key", "ci-builder", "--yes", "--force")
        assert json.loads(run(cp, "image", "list", "--json").stdout) == []
    finally:
        good.close()
        bad.close()


def test_cli_usage_errors(api_server: ControlPlane, tmp_path: Path) -> None:
    out = run(api_server, "image", "register", str(tmp_path / "missing.json"), rc=2)
    assert out.stderr.startswith("error: cannot read manifest")
    (tmp_path / "not-a-key.pub").write_text("hello\n")
    out = run(api_server, "image", "trust-key", str(tmp_path / "not-a-key.pub"), rc=2)  # malformed input
    assert "image-builder keygen" in out.stderr and out.stderr.count("\n") == 1
    assert "no image builder key trusted" in run(api_server, "image", "list-keys").stdout
