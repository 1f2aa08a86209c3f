"""The attested join end to end over HTTP: a real `provision serve` (SQLite; PostgreSQL for the two-process
nonce test), real swtpms with EK certificates from a private vendor CA, the minion's own message builders,
and the real `provision` CLI for the operator's side. One test per refusal, each checking the HTTP answer,
the operator's message and the audit entry."""

from __future__ import annotations

import base64
import itertools
import json
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from minion.join.attest import join_request, parse_challenge, proof_payload, quote_payload
from minion.tpm.session import TpmSession
from provisioner.lab.swtpm import Swtpm, VendorCA
from tests.fixtures.control_plane import ControlPlane, start_control_plane
from tests.fixtures.finalize import current_work, finish_finalize
from tests.fixtures.swtpm import _started_copy

PASSING = {"ok": True, "rules": [{"rule": "tpm", "ok": True}]}


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory, tpm_vendor_ca: VendorCA) -> Iterator[ControlPlane]:
    """One control plane for the module; a fresh quote is asked for every 2nd heartbeat. Nodes are finalized
    by posting an ok report as their minion would (tests/fixtures/finalize.py; the playbooks run on the
    minion side, tests/minion/)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RIGBASE_QUOTE_EVERY", "2")
        with start_control_plane(tmp_path_factory.mktemp("join-cp") / "home") as server:
            ca_file = tmp_path_factory.mktemp("ca") / "vendor.pem"
            ca_file.write_bytes(b"".join(tpm_vendor_ca.certificate_pems()))
            for args in (
                ["provider", "enable", "physical"],
                ["region", "create", "lab", "--provider", "physical"],
                ["region", "create", "other", "--provider", "physical"],
                ["tpm-ca", "add", str(ca_file)],
            ):
                out = server.provision(*args)
                assert out.returncode == 0, out.stderr
            yield server


def cli(cp: ControlPlane, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    out = cp.provision(*args)
    if ok:
        assert out.returncode == 0, out.stderr
    return out


def api(cp: ControlPlane, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    """The operator API directly, where the CLI is not what a test is about (each CLI run costs ~0.7 s)."""
    with cp.client() as client:
        response = client.request(method, path, json=body)
    assert response.is_success, response.text
    return response.json()


def token(cp: ControlPlane, region: str = "lab", ttl: str = "1h") -> str:
    return api(cp, "POST", f"/v1/regions/{region}/join-tokens", {"ttl": ttl})["token"]


def add_node(cp: ControlPlane, name: str, minion_id: str, region: str = "lab") -> None:
    api(cp, "POST", "/v1/nodes", {"name": name, "region": region, "minion_id": minion_id})


class Minion:
    """A minion with its own swtpm talking to the control plane with the real message builders."""

    def __init__(self, tpm: Swtpm, url: str) -> None:
        self.tpm = tpm
        self.session = TpmSession(tpm.tcti)
        self.session.open()
        self.ak = self.session.create_ak()
        self.minion_id = self.session.endorsement_key().minion_id
        self.http = httpx.Client(base_url=url, timeout=30)
        # the firmware's event log its quotes carry (tests/fixtures/eventlog.py); None: it has none
        self.event_log: bytes | None = None

    def close(self) -> None:
        self.session.close()
        self.http.close()

    def begin(
        self, join_token: str, requirements: dict[str, Any] = PASSING, **changes: Any
    ) -> httpx.Response:
        body = json.loads(
            json.dumps(
                join_request(
                    self.session,
                    self.ak,
                    join_token=join_token,
                    inventory={"gpus": []},
                    requirements=requirements,
                )
            )
        )
        body.update(changes)
        return self.http.post("/v1/join", json=body)

    def proof_body(self, challenge: dict[str, Any]) -> dict[str, Any]:
        return proof_payload(self.session, self.ak, parse_challenge(challenge), self.event_log)

    def prove(
        self, challenge: dict[str, Any], join_token: str, body: dict[str, Any] | None = None
    ) -> httpx.Response:
        return self.http.post(
            f"/v1/join/{challenge['join_id']}/proof",
            json=body or self.proof_body(challenge),
            headers={"Authorization": f"Bearer {join_token}"},
        )

    def join(self, join_token: str) -> httpx.Response:
        first = self.begin(join_token)
        assert first.status_code == 201, first.text
        return self.prove(first.json(), join_token)

    def beat(
        self, node: dict[str, Any], quote_nonce: str | None = None, credential: str | None = None
    ) -> httpx.Response:
        body: dict[str, Any] = {"actual": {"maintenance": True}}
        if quote_nonce:
            body["quote"] = quote_payload(
                self.session, self.ak, base64.b64decode(quote_nonce), event_log=self.event_log
            )
        return self.http.post(
            f"/v1/nodes/{node['node_id']}/heartbeat",
            json=body,
            headers={"Authorization": f"Bearer {credential or node['node_credential']}"},
        )


_EK_SERIAL = itertools.count(100)  # the module shares one control plane: every minion needs its own EK


@pytest.fixture
def minion(
    cp: ControlPlane, tmp_path: Path, tpm_vendor_ca: VendorCA, _golden_swtpm: Callable[[VendorCA, int], Swtpm]
) -> Iterator[Callable[..., Minion]]:
    made: list[Minion] = []

    def make(ca: VendorCA | None = None) -> Minion:
        tpm = _started_copy(
            _golden_swtpm(ca or tpm_vendor_ca, next(_EK_SERIAL)), tmp_path / f"swtpm-{len(made)}"
        )
        m = Minion(tpm, cp.url)
        made.append(m)
        return m

    yield make
    for m in made:
        m.close()
        m.tpm.remove()


def audit_rows(cp: ControlPlane, minion_id: str) -> list[str]:
    db = sqlite3.connect(cp.database_url.removeprefix("sqlite:///"))
    try:
        return [
            r[0]
            for r in db.execute(
                "SELECT reason FROM audit_events WHERE resource_kind='join' AND resource_id=? ORDER BY id",
                (minion_id,),
            )
        ]
    finally:
        db.close()


def sql(cp: ControlPlane, statement: str, *params: Any) -> None:
    db = sqlite3.connect(cp.database_url.removeprefix("sqlite:///"))
    with db:
        db.execute(statement, params)
    db.close()


def expire_nonce(cp: ControlPlane, challenge: dict[str, Any]) -> None:
    """Move the challenge's nonce expiry 5 s into the past. Not further: a nonce expired longer ago than
    the join-attempt TTL (10 min) is one the region health pass may purge before the proof arrives, and a
    purged nonce is unknown (403), not late (409); a 2020 expiry made that race (seen once in a
    fresh-clone run)."""
    nonce = base64.b64decode(challenge["nonce"]).hex()
    expired = (datetime.now(UTC) - timedelta(seconds=5)).strftime("%Y-%m-%d %H:%M:%S.%f")
    sql(cp, "UPDATE attestation_nonces SET expires_at = ? WHERE nonce = ?", expired, nonce)


def assert_refused(cp: ControlPlane, response: httpx.Response, minion_id: str, code: str, words: str) -> None:
    assert response.status_code in (401, 403, 409, 422), response.text
    body = response.json()
    assert body["code"] == code, body
    assert words in body["message"]
    reasons = audit_rows(cp, minion_id)
    assert reasons and code in reasons[-1], reasons
    shown = api(cp, "GET", f"/v1/join-refusals?minion_id={minion_id}")["items"]
    assert code in shown[0]["reason"]


def node_state(cp: ControlPlane, name: str) -> dict[str, Any]:
    return api(cp, "GET", f"/v1/nodes/{name}")


def wait_state(cp: ControlPlane, name: str, state: str, timeout: float = 20) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        node = node_state(cp, name)
        if node["state"] == state or time.monotonic() > deadline:
            assert node["state"] == state, node
            return node
        time.sleep(0.2)


# ---------------------------------------------------------------- the happy path


def test_pending_adopt_heartbeat_continuous_attestation_retry(
    cp: ControlPlane, minion: Callable[..., Minion]
) -> None:
    m = minion()
    jt = token(cp)
    # No node yet: attested, then pending, listed for the operator.
    first = m.join(jt)
    assert first.status_code == 202 and first.json()["state"] == "pending", first.text
    pending = json.loads(cli(cp, "node", "pending", "--region", "lab", "--json").stdout)
    mine = next(p for p in pending if p["minion_id"] == m.minion_id)
    assert mine["attested"] is True and mine["requirements"] == "pass"
    # The operator adopts it; the minion's next attempt moves it on.
    cli(cp, "node", "add", "gpu-1", "--region", "lab", "--minion-id", m.minion_id)
    joined = m.join(jt)
    assert joined.status_code == 200, joined.text
    node = joined.json()
    assert node["state"] == "provisioning" and node["node_credential"].startswith("rbn_")
    assert m.minion_id not in cli(cp, "node", "pending").stdout
    # The join token is not a node credential.
    assert m.beat(node, credential=jt).status_code == 401
    # Heartbeats: desired state out (the finalize work from provisioning on); every 2nd beat asks for a
    # fresh quote, which verifies. The minion finalizes and reports: the node moves on to maintenance.
    beat1 = m.beat(node).json()
    assert beat1["desired"]["maintenance"] is True and beat1["quote_nonce"] is None
    first_generation = beat1["desired"]["finalize"]["generation"]
    finish_finalize(cp.url, node["node_id"], node["node_credential"], first_generation)
    wait_state(cp, "gpu-1", "maintenance")
    history = cli(cp, "node", "history", "gpu-1").stdout
    for step in ("enrolling", "provisioning", "maintenance", "attested", "finalized in"):
        assert step in history
    beat2 = m.beat(node).json()
    assert beat2["quote_nonce"]
    beat3 = m.beat(node, beat2["quote_nonce"]).json()
    assert beat3["state"] == "maintenance", beat3
    assert node_state(cp, "gpu-1")["online"] is True
    # The region reports healthy once a node heartbeats.
    deadline = time.monotonic() + 10
    while api(cp, "GET", "/v1/regions/lab")["state"] != "healthy":
        assert time.monotonic() < deadline, "region never became healthy"
        time.sleep(0.2)
    # A changed PCR: the next fresh quote moves the node to errored with the reason.
    m.session.extend_pcr(14, b"a different shim")
    nonce = beat3["quote_nonce"] or m.beat(node).json()["quote_nonce"]
    after = m.beat(node, nonce).json()
    assert after["state"] == "errored" and "PCR 14" in after["reason"], after
    assert "attestation_pcr_changed" in audit_rows(cp, m.minion_id)[-1]
    # A join while errored says how to get out; retry (accepting the new PCRs) lets it join again.
    stuck = m.begin(jt)
    assert stuck.status_code == 409 and "provision node retry gpu-1" in stuck.json()["message"]
    cli(cp, "node", "retry", "gpu-1", "--accept-pcrs")
    assert m.beat(node).status_code == 401  # the old credential died with the retry
    again = m.join(jt)
    assert again.status_code == 200 and again.json()["state"] == "provisioning", again.text
    # the retry gave the node a new finalize generation: its minion runs the playbook again
    rejoined = again.json()
    work = current_work(cp.url, rejoined["node_id"], rejoined["node_credential"])
    assert work["generation"] != first_generation
    finish_finalize(cp.url, rejoined["node_id"], rejoined["node_credential"], work["generation"])
    assert wait_state(cp, "gpu-1", "maintenance")["finalize_applied"] == work["generation"]


# ---------------------------------------------------------------- refusals


def test_refused_ek_from_untrusted_ca(
    cp: ControlPlane, minion: Callable[..., Minion], untrusted_vendor_ca: VendorCA
) -> None:
    m = minion(untrusted_vendor_ca)
    assert_refused(cp, m.begin(token(cp)), m.minion_id, "attestation_ek_untrusted_ca", "provision tpm-ca add")


def test_refused_ek_not_matching_minion_id(cp: ControlPlane, minion: Callable[..., Minion]) -> None:
    m = minion()
    claimed = "0" * 32
    assert_refused(
        cp,
        m.begin(token(cp), minion_id=claimed),
        claimed,
        "attestation_minion_id_mismatch",
        "does not match the EK",
    )


def test_refused_wrong_activated_secret(cp: ControlPlane, minion: Callable[..., Minion]) -> None:
    m = minion()
    jt = token(cp)
    add_node(cp, "secret-1", m.minion_id, "lab")
    challenge = m.begin(jt).json()
    body = m.proof_body(challenge)
    body["activated_secret"] = base64.b64encode(b"\x00" * 32).decode()
    assert_refused(
        cp, m.prove(challenge, jt, body), m.minion_id, "attestation_wrong_secret", "could not recover"
    )
    assert "attestation_wrong_secret" in str(api(cp, "GET", "/v1/nodes/secret-1/history"))
    # anyone knowing the EK could cause this, so it errors nothing; and since only a verified proof
    # starts a join, the node has not moved at all (it used to show enrolling)
    assert node_state(cp, "secret-1")["state"] == "new"


def test_refused_quote_with_one_byte_changed(cp: ControlPlane, minion: Callable[..., Minion]) -> None:
    m = minion()
    jt = token(cp)
    add_node(cp, "quote-1", m.minion_id, "lab")
    challenge = m.begin(jt).json()
    body = m.proof_body(challenge)
    attest = bytearray(base64.b64decode(body["quote"]["attest"]))
    attest[-3] ^= 0x01
    body["quote"]["attest"] = base64.b64encode(bytes(attest)).decode()
    assert_refused(
        cp, m.prove(challenge, jt, body), m.minion_id, "attestation_quote_signature_invalid", "altered"
    )
    node = node_state(cp, "quote-1")
    assert node["state"] == "errored" and "altered" in node["reason"]


def test_refused_replayed_nonce(cp: ControlPlane, minion: Callable[..., Minion]) -> None:
    m = minion()
    jt = token(cp)
    challenge = m.begin(jt).json()
    body = m.proof_body(challenge)
    assert m.prove(challenge, jt, body).status_code == 202
    assert_refused(
        cp, m.prove(challenge, jt, body), m.minion_id, "attestation_nonce_replayed", "already used"
    )


def test_refused_expired_nonce(cp: ControlPlane, minion: Callable[..., Minion]) -> None:
    m = minion()
    jt = token(cp)
    challenge = m.begin(jt).json()
    body = m.proof_body(challenge)
    expire_nonce(cp, challenge)  # as if the proof came after the nonce's 60 s, without sleeping them
    assert_refused(cp, m.prove(challenge, jt, body), m.minion_id, "attestation_nonce_expired", "expired")


def test_expired_challenges_do_not_spend_the_failed_authentication_budget(
    cp: ControlPlane, minion: Callable[..., Minion]
) -> None:
    """A proof that comes after its challenge expired (a slow link, a busy TPM) is 409, not 403: eighty of
    them from one address (a site behind NAT) never get it rate-limited, where fifty failed
    authentications would (api/limits.py, test_limits_http.py)."""
    m = minion()
    m.http = httpx.Client(
        base_url=cp.url,
        timeout=30,
        transport=httpx.HTTPTransport(local_address="127.0.0.9", verify=cp.verify),
    )
    jt = token(cp)
    answers = []
    for _ in range(80):
        challenge = m.begin(jt).json()
        body = m.proof_body(challenge)
        expire_nonce(cp, challenge)
        answers.append(m.prove(challenge, jt, body).status_code)
    assert answers == [409] * 80, answers
    joined = m.join(jt)  # the next join from that address is served
    assert joined.status_code in (200, 202), joined.text


def test_refused_wrong_pcrs(cp: ControlPlane, minion: Callable[..., Minion]) -> None:
    m = minion()
    jt = token(cp)
    add_node(cp, "pcr-1", m.minion_id, "lab")
    joined = m.join(jt)
    assert joined.status_code == 200  # records the baseline
    finish_finalize(cp.url, joined.json()["node_id"], joined.json()["node_credential"])
    wait_state(cp, "pcr-1", "maintenance")
    m.session.extend_pcr(7, b"secure boot turned off")
    challenge = m.begin(jt).json()
    assert_refused(cp, m.prove(challenge, jt), m.minion_id, "attestation_pcr_changed", "PCR 7")
    assert node_state(cp, "pcr-1")["state"] == "errored"


def test_refused_revoked_and_expired_join_tokens(cp: ControlPlane, minion: Callable[..., Minion]) -> None:
    m = minion()
    revoked = token(cp, "other")
    assert api(cp, "DELETE", "/v1/regions/other/join-tokens")["revoked"] >= 1
    assert_refused(cp, m.begin(revoked), m.minion_id, "join_token_revoked", "provision region join-token")
    short = token(cp, ttl="1s")
    time.sleep(1.2)
    assert_refused(cp, m.begin(short), m.minion_id, "join_token_expired", "expired")
    assert_refused(cp, m.begin("rbj_made-up"), m.minion_id, "join_token_invalid", "provision region bundle")


def test_refused_duplicate_minion_id_from_a_different_ek(
    cp: ControlPlane, minion: Callable[..., Minion]
) -> None:
    m = minion()
    jt = token(cp)
    assert m.join(jt).status_code == 202
    # A minion_id is 128 bits of the EK's hash, so a real collision cannot be made: record that this
    # minion_id was first seen with another EK, which is what a collision (or a forged claim) looks like.
    sql(cp, "UPDATE pending_minions SET ek_sha256 = ? WHERE minion_id = ?", "ab" * 32, m.minion_id)
    assert_refused(cp, m.begin(jt), m.minion_id, "attestation_duplicate_minion_id", "two TPMs")


def test_refused_right_node_in_the_wrong_region(cp: ControlPlane, minion: Callable[..., Minion]) -> None:
    m = minion()
    add_node(cp, "elsewhere-1", m.minion_id, "other")
    assert_refused(cp, m.begin(token(cp, "lab")), m.minion_id, "join_wrong_region", "region 'other'")


def test_failed_requirements_block_the_join_with_reasons(
    cp: ControlPlane, minion: Callable[..., Minion]
) -> None:
    m = minion()
    failing = {"ok": False, "rules": [{"rule": "nvme_capacity", "ok": False}, {"rule": "tpm", "ok": True}]}
    assert_refused(
        cp, m.begin(token(cp), requirements=failing), m.minion_id, "join_requirements_failed", "nvme_capacity"
    )
    pending = api(cp, "GET", "/v1/pending-minions")["items"]
    assert next(p for p in pending if p["minion_id"] == m.minion_id)["requirements"] == "fail: nvme_capacity"


def _self_signed_leaf() -> bytes:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "not-a-ca")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM)


def test_operator_commands_refuse_bad_input(cp: ControlPlane, tmp_path: Path) -> None:
    bad = cli(cp, "region", "join-token", "lab", "--ttl", "soon", ok=False)
    assert bad.returncode == 2 and "TTL 'soon'" in bad.stderr
    not_ca = tmp_path / "x.pem"
    not_ca.write_text("hello")
    assert cli(cp, "tpm-ca", "add", str(not_ca), ok=False).returncode == 2
    leaf = tmp_path / "leaf.pem"  # a certificate, but no CA (what an operator adding an EK cert passes)
    leaf.write_bytes(_self_signed_leaf())
    refused = cli(cp, "tpm-ca", "add", str(leaf), ok=False)
    assert refused.returncode == 2 and "is not a CA" in refused.stderr, refused.stderr
    assert cli(cp, "node", "retry", "nope", ok=False).returncode == 1
    out = tmp_path / "bundle.json"
    # the default URL is the CLI's own, on loopback: media made from it could never reach the control plane
    refused = cli(cp, "region", "bundle", "lab", "-o", str(out), ok=False)
    assert refused.returncode == 2 and "loopback" in refused.stderr and refused.stderr.count("\n") == 1
    assert not out.exists()
    cli(cp, "region", "bundle", "lab", "-o", str(out), "--allow-loopback")
    bundle = json.loads(out.read_text())
    assert (
        bundle["region"] == "lab"
        and bundle["join_token"].startswith("rbj_")
        and bundle["control_plane_url"] == cp.url
    )
    assert out.stat().st_mode & 0o777 == 0o600
    cas = json.loads(cli(cp, "tpm-ca", "list", "--json").stdout)
    assert len(cas) == 2  # root and intermediate of the vendor CA
    shown = json.loads(cli(cp, "region", "update", "other", "--allow-ek-without-cert", "--json").stdout)
    assert shown["settings"]["allow_ek_without_certificate"] is True


def test_pinned_ek_joins_without_certificate_only_with_that_ek(
    cp: ControlPlane, minion: Callable[..., Minion]
) -> None:
    pinned, impostor = minion(), minion()
    ek = pinned.session.endorsement_key()
    add_node(cp, "gcp-store", pinned.minion_id)
    sql(cp, "UPDATE nodes SET pinned_ek_public = ? WHERE name = 'gcp-store'", ek.spki_der)
    jt = token(cp)
    first = pinned.begin(jt, ek_certificate=None)  # a vTPM without a vendor certificate
    assert first.status_code == 201, first.text
    assert pinned.prove(first.json(), jt).status_code == 200
    # Another TPM claiming that node is refused (it reports the node's minion_id, so the pin decides).
    forged = impostor.begin(jt, ek_certificate=None, minion_id=pinned.minion_id)
    assert forged.status_code == 403 and forged.json()["code"] == "attestation_pinned_ek_mismatch"


# ---------------------------------------------------------------- proven reports, bounded quotes

H100S = {"gpus": [{"model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559}] * 8}


def _attested_node(cp: ControlPlane, m: Minion, name: str) -> dict[str, Any]:
    add_node(cp, name, m.minion_id, "lab")
    joined = m.join(token(cp))
    assert joined.status_code == 200, joined.text
    node = dict(joined.json())
    finish_finalize(cp.url, node["node_id"], node["node_credential"])
    wait_state(cp, name, "maintenance")
    # the fixture's heartbeat (it read the finalize work) is not one of the test's: count from 0 again,
    # so the tests about quote spacing see their own beats 1, 2, 3
    sql(cp, "UPDATE nodes SET heartbeats = 0 WHERE id = ?", node["node_id"])
    return node


def test_a_replayed_join_request_changes_nothing_without_the_proof(
    cp: ControlPlane, minion: Callable[..., Minion]
) -> None:
    """Step 1 of a join carries no proof of possession: replaying it (edited) may only open a challenge."""
    m = minion()
    jt = token(cp)
    node = _attested_node(cp, m, "replay-1")
    m.beat(node)
    before = node_state(cp, "replay-1")
    history = api(cp, "GET", "/v1/nodes/replay-1/history")["items"]
    assert before["inventory"]["gpus"] == []
    time.sleep(0.05)
    replayed = m.begin(jt, inventory=H100S)
    assert replayed.status_code == 201, replayed.text  # a challenge only: nothing stored from the report
    after = node_state(cp, "replay-1")
    assert after["inventory"] == before["inventory"]
    assert after["last_heartbeat_at"] == before["last_heartbeat_at"]
    assert after["state"] == "maintenance"
    assert api(cp, "GET", "/v1/nodes/replay-1/history")["items"] == history
    # A node an operator added but that never proved itself stays new: only a verified proof starts it.
    fresh = minion()
    add_node(cp, "replay-2", fresh.minion_id, "lab")
    assert fresh.begin(jt, inventory=H100S).status_code == 201
    shown = node_state(cp, "replay-2")
    assert shown["state"] == "new" and shown["inventory"] is None and shown["last_heartbeat_at"] is None
    # An attested pending minion keeps what it proved.
    waiting = minion()
    assert waiting.join(jt).status_code == 202

    def listed() -> dict[str, Any]:
        items = api(cp, "GET", "/v1/pending-minions")["items"]
        return dict(next(p for p in items if p["minion_id"] == waiting.minion_id))

    proven = listed()
    assert waiting.begin(jt, inventory=H100S).status_code == 201
    assert listed()["inventory"] == proven["inventory"] and "H100" not in str(listed())
    # The proof applies what its own step 1 reported.
    challenge = fresh.begin(jt, inventory=H100S).json()
    assert fresh.prove(challenge, jt).status_code == 200
    assert node_state(cp, "replay-2")["inventory"]["gpus"] == H100S["gpus"]


def test_a_node_that_ignores_quote_requests_goes_errored(
    cp: ControlPlane, minion: Callable[..., Minion]
) -> None:
    """Continuous attestation is enforced: a quote asked for must come within quote_grace_beats (3)."""
    m = minion()
    node = _attested_node(cp, m, "noquote-1")
    answers = [m.beat(node).json() for _ in range(4)]  # beat 2 asks (every 2nd); 3 and 4 ignore it
    assert answers[0]["quote_nonce"] is None and all(a["quote_nonce"] for a in answers[1:])
    assert all(a["state"] == "maintenance" for a in answers), answers
    late = m.beat(node).json()  # the 3rd beat since the request: errored, with what to do
    assert late["state"] == "errored", late
    assert "no quote answered within 3 heartbeats" in late["reason"]
    assert "provision node retry noquote-1" in late["reason"] and late["quote_nonce"] is None
    history = cli(cp, "node", "history", "noquote-1").stdout
    assert "no quote answered" in history
    # An errored node is not asked again and stays errored (until the operator retries it).
    again = m.beat(node).json()
    assert again["state"] == "errored" and again["quote_nonce"] is None
    shown = json.loads(cli(cp, "node", "show", "noquote-1", "--json").stdout)
    assert "last_quote_at" in shown and shown["last_quote_at"] is None
    assert "last_quote_at" in cli(cp, "node", "show", "noquote-1").stdout


def test_a_quote_answered_late_is_asked_again_and_the_grace_still_counts(
    cp: ControlPlane, minion: Callable[..., Minion]
) -> None:
    """An answer whose nonce expired on the way (a control plane behind its fleet queues beats for most of
    an interval) proves nothing and errors nothing: its answer asks again. A node that only ever answers
    late goes errored when the grace runs out, as one that never answers."""
    m = minion()
    node = _attested_node(cp, m, "late-1")
    assert m.beat(node).json()["quote_nonce"] is None
    asked = m.beat(node).json()["quote_nonce"]  # beat 2 asks (every 2nd)
    expire_nonce(cp, {"nonce": asked})
    late = m.beat(node, asked).json()
    assert late["state"] == "maintenance" and late["quote_nonce"] not in (None, asked), late
    assert json.loads(cli(cp, "node", "show", "late-1", "--json").stdout)["last_quote_at"] is None
    on_time = m.beat(node, late["quote_nonce"]).json()  # beat 4: verified, and (a due beat) asks again
    assert on_time["state"] == "maintenance" and on_time["quote_nonce"], on_time
    assert json.loads(cli(cp, "node", "show", "late-1", "--json").stdout)["last_quote_at"] is not None
    assert not any("nonce_expired" in reason for reason in audit_rows(cp, m.minion_id))  # nothing refused

    # always late: beats 5 and 6 answer beat 4's request late; beat 7, the 3rd since it, is past the grace
    asked = on_time["quote_nonce"]
    answers = []
    for _ in range(3):
        expire_nonce(cp, {"nonce": asked})
        answers.append(m.beat(node, asked).json())
        asked = answers[-1]["quote_nonce"]
    assert [a["state"] for a in answers] == ["maintenance", "maintenance", "errored"], answers
    assert "no quote answered within 3 heartbeats" in answers[-1]["reason"]


def test_an_old_last_quote_asks_for_one_at_once(cp: ControlPlane, minion: Callable[..., Minion]) -> None:
    """A node whose last verified quote (or join) is older than twice the quote spacing is asked for a
    quote on its next beat, whatever the beat count; the answer shows in `node show`."""
    m = minion()
    node = _attested_node(cp, m, "oldquote-1")
    sql(
        cp,
        "UPDATE node_attestations SET attested_at = '2020-01-01 00:00:00.000000' WHERE node_id = ?",
        node["node_id"],
    )
    first = m.beat(node).json()
    assert first["quote_nonce"], first  # beat 1 is not a due beat: asked because the last proof is old
    answered = m.beat(node, first["quote_nonce"]).json()
    assert answered["state"] == "maintenance", answered
    shown = json.loads(cli(cp, "node", "show", "oldquote-1", "--json").stdout)
    assert shown["last_quote_at"] is not None
    listed = api(cp, "GET", "/v1/nodes?limit=500")["items"]
    assert next(n for n in listed if n["name"] == "oldquote-1")["last_quote_at"] == shown["last_quote_at"]


# ---------------------------------------------------------------- two API processes, one nonce


def test_a_nonce_is_single_use_across_two_api_processes(
    postgres_cluster: Any,
    tmp_path: Path,
    tpm_vendor_ca: VendorCA,
    make_swtpm: Callable[..., Swtpm],
) -> None:
    url = postgres_cluster.create_database()
    with (
        start_control_plane(tmp_path / "a", url) as a,
        start_control_plane(tmp_path / "b", url, token=None) as b,
    ):
        ca_file = tmp_path / "vendor.pem"
        ca_file.write_bytes(b"".join(tpm_vendor_ca.certificate_pems()))
        for args in (
            ["provider", "enable", "physical"],
            ["region", "create", "pg", "--provider", "physical"],
            ["tpm-ca", "add", str(ca_file)],
        ):
            cli(a, *args)
        jt = token(a, "pg")
        m = Minion(make_swtpm(), a.url)
        try:
            challenge = m.begin(jt).json()
            body = m.proof_body(challenge)
            path = f"/v1/join/{challenge['join_id']}/proof"
            headers = {"Authorization": f"Bearer {jt}"}
            with ThreadPoolExecutor(2) as pool:
                answers = list(
                    pool.map(
                        lambda server: httpx.post(server.url + path, json=body, headers=headers, timeout=30),
                        [a, b],
                    )
                )
        finally:
            m.close()
    codes = sorted(r.status_code for r in answers)
    assert codes == [202, 403], [r.text for r in answers]
    assert next(r for r in answers if r.status_code == 403).json()["code"] == "attestation_nonce_replayed"
