"""The boot path (PCR 4) end to end: a real `provision serve`, the real `provision image` and `provision
node` CLI, real swtpms whose PCR 4 holds what the firmware's event log says (tests/fixtures/eventlog.py),
and the minion's own message builders. In a region with a registered manifest a node joins only with a
log that replays to its quoted PCR 4 and names only the manifest's EFI applications; each refusal is
answered, audited, shown by `provision node refusals`, and leaves no attestation behind. A tampered log in
continuous attestation moves the node to errored."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from provisioner.lab.swtpm import Swtpm, VendorCA
from tests.fixtures.control_plane import ControlPlane, start_control_plane
from tests.fixtures.eventlog import boot_path_events, extend_digests, write_event_log
from tests.fixtures.manifests import Builder
from tests.fixtures.swtpm import _started_copy
from tests.provisioner.test_join_http import Minion, add_node, api, token

PE_HASHES = {"systemd-boot": "5b" * 32, "uki": "6c" * 32, "kernel": "7d" * 32}
BOOT = list(PE_HASHES.values())
STRANGER = "e0" * 32


@pytest.fixture
def cp(tmp_path: Path, tpm_vendor_ca: VendorCA, monkeypatch: pytest.MonkeyPatch) -> Iterator[ControlPlane]:
    """A region `lab` with a manifest naming PE_HASHES; a fresh quote every 2nd heartbeat."""
    monkeypatch.setenv("RIGBASE_QUOTE_EVERY", "2")
    with start_control_plane(tmp_path / "home") as server:
        ca_file = tmp_path / "vendor.pem"
        ca_file.write_bytes(b"".join(tpm_vendor_ca.certificate_pems()))
        api(server, "POST", "/v1/providers", {"kind": "physical", "config": {}})
        api(server, "POST", "/v1/regions", {"name": "lab", "provider": "physical"})
        api(server, "POST", "/v1/tpm-cas", {"pem": ca_file.read_text()})
        builder = Builder(tmp_path / "builder")
        manifest = builder.write(tmp_path / "image", builder.manifest(pe_hashes=PE_HASHES))
        for args in (("image", "trust-key", str(builder.public_path)), ("image", "register", str(manifest))):
            out = server.provision(*args)
            assert out.returncode == 0, out.stderr
        yield server


@pytest.fixture
def booted(
    cp: ControlPlane, tmp_path: Path, tpm_vendor_ca: VendorCA, _golden_swtpm: Callable[[VendorCA, int], Swtpm]
) -> Iterator[Callable[..., Minion]]:
    """make(name, ran=[digests], log=[digests] | None): a minion adopted as node `name` whose firmware
    ran `ran` (PCR 4 extended so) and which sends the log of `log` (default: what it ran)."""
    made: list[Minion] = []

    def make(
        name: str, ran: list[str], log: list[str] | None = None, send_log: bool = True, add: bool = True
    ) -> Minion:
        tpm = _started_copy(_golden_swtpm(tpm_vendor_ca, len(made)), tmp_path / f"swtpm-{name}")
        m = Minion(tpm, cp.url)
        made.append(m)
        extend_digests(m.session, boot_path_events(ran))
        m.event_log = write_event_log(boot_path_events(ran if log is None else log)) if send_log else None
        if add:
            add_node(cp, name, m.minion_id)
        return m

    yield make
    for m in made:
        m.close()
        m.tpm.remove()


def attestations(cp: ControlPlane) -> set[str]:
    db = sqlite3.connect(cp.database_url.removeprefix("sqlite:///"))
    try:
        return {row[0] for row in db.execute("SELECT node_id FROM node_attestations")}
    finally:
        db.close()


def refusals(cp: ControlPlane, minion_id: str) -> list[dict[str, Any]]:
    out = cp.provision("node", "refusals", "--minion-id", minion_id, "--json")
    assert out.returncode == 0, out.stderr
    rows: list[dict[str, Any]] = json.loads(out.stdout)
    return rows


@pytest.mark.parametrize(
    ("case", "code", "words"),
    [
        ("mismatch", "attestation_event_log_mismatch", "does not replay to the quoted PCR 4"),
        ("unknown", "attestation_unknown_boot_application", STRANGER),
        ("no_log", "attestation_no_event_log", "no TCG event log"),
    ],
)
def test_boot_path_refusals(
    cp: ControlPlane, booted: Callable[..., Minion], case: str, code: str, words: str
) -> None:
    m = {
        "mismatch": lambda: booted("gpu-x", ran=BOOT, log=BOOT[:2]),  # a log of another boot
        "unknown": lambda: booted("gpu-x", ran=[BOOT[0], STRANGER, BOOT[2]]),  # replays; not the manifest's
        "no_log": lambda: booted("gpu-x", ran=BOOT, send_log=False),  # an old minion
    }[case]()
    before = attestations(cp)
    answer = m.join(token(cp))
    assert answer.status_code == 403, answer.text
    body = answer.json()
    assert body["code"] == code and words in body["message"] and "\n" not in body["message"], body
    assert attestations(cp) == before  # nothing recorded for the refused node: no AK, no credential
    shown = refusals(cp, m.minion_id)
    assert code in shown[0]["reason"] and "lab" in shown[0]["reason"]
    node = api(cp, "GET", "/v1/nodes/gpu-x")
    assert node["state"] == "errored" and words in node["reason"]


def test_a_pending_minion_keeps_its_refusal_through_its_retries(
    cp: ControlPlane, booted: Callable[..., Minion]
) -> None:
    """A minion not yet adopted, refused at step 2 (its boot path names an unknown application), retries
    step 1 at once; `node pending` keeps showing why it got no further, never as attested."""
    m = booted("gpu-x", ran=[BOOT[0], STRANGER, BOOT[2]], add=False)
    jt = token(cp)
    assert m.join(jt).json()["code"] == "attestation_unknown_boot_application"

    def listed() -> dict[str, Any]:
        rows = api(cp, "GET", "/v1/pending-minions")["items"]
        return next(p for p in rows if p["minion_id"] == m.minion_id)

    assert listed()["attested"] is False and STRANGER in str(listed()["refusal"])
    assert m.begin(jt).status_code == 201  # the retry's step 1 proves nothing
    assert listed()["attested"] is False and STRANGER in str(listed()["refusal"])


def test_matching_log_joins_and_a_tampered_log_errors_the_node(
    cp: ControlPlane, booted: Callable[..., Minion]
) -> None:
    m = booted("gpu-1", ran=BOOT)
    joined = m.join(token(cp))
    assert joined.status_code == 200 and joined.json()["state"] == "provisioning", joined.text
    node = joined.json()
    ok = m.beat(node, next_nonce(m, node)).json()
    assert ok["state"] == "provisioning", ok
    # the log now claims another kernel than the firmware measured: it no longer replays to PCR 4
    m.event_log = write_event_log(boot_path_events([*BOOT[:2], STRANGER]))
    after = m.beat(node, next_nonce(m, node)).json()
    assert after["state"] == "errored" and "event log" in after["reason"], after
    assert "attestation_event_log_mismatch" in refusals(cp, m.minion_id)[0]["reason"]


def next_nonce(m: Minion, node: dict[str, Any]) -> str:
    """Beat until the control plane asks for a fresh quote (every 2nd beat here); the latest nonce."""
    for _ in range(3):
        nonce: str | None = m.beat(node).json()["quote_nonce"]
        if nonce:
            return nonce
    raise AssertionError("no fresh quote asked for within 3 heartbeats")


def test_the_real_minion_sends_the_log_its_settings_name(
    cp: ControlPlane,
    tmp_path: Path,
    swtpm: Swtpm,
    profile_inventory: Callable[[str], dict[str, Any]],
) -> None:
    """`minion join` as a node runs it, the firmware log at RIGBASE_EVENT_LOG: with no file there (the
    lab's swtpm nodes) it sends none and the manifest region refuses it; with the firmware's log it joins."""
    from minion.tpm.session import TpmSession
    from tests.fixtures.umockdev import minion_executable

    inventory = tmp_path / "inventory.json"
    inventory.write_text(json.dumps(profile_inventory("h100-sxm-server")))
    made = cp.provision("region", "bundle", "lab", "-o", str(tmp_path / "bundle.json"), "--allow-loopback")
    assert made.returncode == 0, made.stderr
    with TpmSession(swtpm.tcti) as session:
        extend_digests(session, boot_path_events(BOOT))
        minion_id = session.endorsement_key().minion_id
    add_node(cp, "gpu-1", minion_id)
    firmware_log = tmp_path / "binary_bios_measurements"

    def minion_join() -> dict[str, Any]:
        out = subprocess.run(
            [
                str(minion_executable()),
                "join",
                "--bundle",
                str(tmp_path / "bundle.json"),
                "--tcti",
                swtpm.tcti,
                "--state-dir",
                str(tmp_path / "state"),
                "--inventory",
                str(inventory),
                "--json",
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "TSS2_LOG": "all+none", "RIGBASE_EVENT_LOG": str(firmware_log)},
            timeout=120,
        )
        return {"rc": out.returncode, "out": out.stdout + out.stderr}

    refused = minion_join()
    assert refused["rc"] != 0 and "attestation_no_event_log" in refusals(cp, minion_id)[0]["reason"], refused
    assert cp.provision("node", "retry", "gpu-1").returncode == 0
    firmware_log.write_bytes(write_event_log(boot_path_events(BOOT)))
    joined = minion_join()
    assert joined["rc"] == 0 and "provisioning" in joined["out"], joined
