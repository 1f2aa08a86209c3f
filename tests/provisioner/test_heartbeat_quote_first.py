"""A heartbeat's quote is checked before anything the heartbeat reports is stored. A beat that
answers a quote request with a forged quote must change nothing but what the refusal records (the audit
line, the node errored, the nonce spent): not the inventory, requirements, finalize report, heartbeat
time or beat count. A real `provision serve` (SQLite, TLS), a real swtpm-joined node, the minion's own
message builders; the same beat with a genuine quote is the control that shows the reports are stored."""

from __future__ import annotations

import base64
import itertools
import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from minion.join.attest import join_request, parse_challenge, proof_payload, quote_payload
from minion.tpm.session import TpmSession
from provisioner.lab.swtpm import Swtpm, VendorCA
from tests.fixtures.control_plane import ControlPlane, start_control_plane
from tests.fixtures.finalize import finish_finalize
from tests.fixtures.swtpm import _started_copy

H100S = {"gpus": [{"model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559}] * 8}
FORGED_REPORT: dict[str, Any] = {
    "actual": {"maintenance": True, "finalize": {"state": "applied", "scratch": "/forged"}},
    "inventory": H100S,
    "requirements": {"ok": True, "rules": [{"rule": "gpu", "ok": True}]},
}


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory, tpm_vendor_ca: VendorCA) -> Iterator[ControlPlane]:
    """A control plane that asks for a fresh quote every 2nd heartbeat."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RIGBASE_QUOTE_EVERY", "2")
        with start_control_plane(tmp_path_factory.mktemp("quote-first") / "home") as server:
            with server.client() as c:
                c.post("/v1/providers", json={"kind": "physical"}).raise_for_status()
                c.post("/v1/regions", json={"name": "lab", "provider": "physical"}).raise_for_status()
                pem = b"".join(tpm_vendor_ca.certificate_pems()).decode()
                c.post("/v1/tpm-cas", json={"pem": pem}).raise_for_status()
            yield server


class JoinedNode:
    """A node joined with its own swtpm, finalized (→ maintenance), beating as its minion would."""

    def __init__(self, cp: ControlPlane, tpm: Swtpm, name: str) -> None:
        self.cp, self.name = cp, name
        self.session = TpmSession(tpm.tcti)
        self.session.open()
        self.ak = self.session.create_ak()
        minion_id = self.session.endorsement_key().minion_id
        self.http = httpx.Client(base_url=cp.url, timeout=30)
        with cp.client() as c:
            c.post(
                "/v1/nodes", json={"name": name, "region": "lab", "minion_id": minion_id}
            ).raise_for_status()
            join_token = c.post("/v1/regions/lab/join-tokens", json={"ttl": "1h"}).json()["token"]
        body = join_request(
            self.session,
            self.ak,
            join_token=join_token,
            inventory={"gpus": []},
            requirements={"ok": True, "rules": []},
        )
        challenge = parse_challenge(self.http.post("/v1/join", json=body).json())
        proof = self.http.post(
            f"/v1/join/{challenge.join_id}/proof",
            json=proof_payload(self.session, self.ak, challenge),
            headers={"Authorization": f"Bearer {join_token}"},
        )
        assert proof.status_code == 200, proof.text
        self.node_id: str = proof.json()["node_id"]
        self.credential: str = proof.json()["node_credential"]
        finish_finalize(self.http, self.node_id, self.credential)

    def beat(self, body: dict[str, Any]) -> dict[str, Any]:
        answer = self.http.post(
            f"/v1/nodes/{self.node_id}/heartbeat",
            json={"version": 1, **body},
            headers={"Authorization": f"Bearer {self.credential}"},
        )
        assert answer.status_code == 200, answer.text
        return dict(answer.json())

    def nonce(self) -> bytes:
        """Beat (reporting nothing new) until the control plane asks for a quote; its nonce."""
        for _ in range(3):
            asked = self.beat({"actual": {"maintenance": True}})["quote_nonce"]
            if asked:
                return base64.b64decode(asked)
        raise AssertionError("no quote asked for within 3 beats (RIGBASE_QUOTE_EVERY=2)")

    def quote(self, nonce: bytes) -> dict[str, Any]:
        return quote_payload(self.session, self.ak, nonce)

    def close(self) -> None:
        self.session.close()
        self.http.close()


_EK_SERIAL = itertools.count(1)  # the module shares one control plane: every node needs its own EK


@pytest.fixture
def joined(
    cp: ControlPlane,
    tmp_path: Path,
    tpm_vendor_ca: VendorCA,
    _golden_swtpm: Callable[[VendorCA, int], Swtpm],
) -> Iterator[Callable[[str], JoinedNode]]:
    made: list[tuple[JoinedNode, Swtpm]] = []

    def join(name: str) -> JoinedNode:
        tpm = _started_copy(_golden_swtpm(tpm_vendor_ca, next(_EK_SERIAL)), tmp_path / f"swtpm-{name}")
        try:
            node = JoinedNode(cp, tpm, name)
        except BaseException:
            tpm.remove()
            raise
        made.append((node, tpm))
        return node

    yield join
    for node, tpm in made:
        node.close()
        tpm.remove()


def stored(cp: ControlPlane, node: JoinedNode) -> dict[str, Any]:
    """Everything a heartbeat may write, read from the database itself (not through the API), and the
    node's audit lines (its transitions, keyed by node id; join refusals, keyed by minion_id)."""
    columns = ("state", "inventory", "requirements", "last_heartbeat_at", "finalize_actual")
    db = sqlite3.connect(cp.database_url.removeprefix("sqlite:///"))
    try:
        row = db.execute(
            f"SELECT {', '.join('n.' + c for c in columns)}, n.heartbeats, a.last_quote_at, a.quote_nonce, "
            "n.minion_id FROM nodes n JOIN node_attestations a ON a.node_id = n.id WHERE n.id = ?",
            (node.node_id,),
        ).fetchone()
        seen = dict(
            zip((*columns, "heartbeats", "last_quote_at", "quote_nonce", "minion_id"), row, strict=True)
        )
        audit = db.execute(
            "SELECT resource_kind, to_state, reason FROM audit_events "
            "WHERE resource_id IN (?, ?) ORDER BY id",
            (node.node_id, seen["minion_id"]),
        ).fetchall()
    finally:
        db.close()
    for key in ("inventory", "requirements", "finalize_actual"):
        seen[key] = json.loads(seen[key]) if seen[key] else None
    return {**seen, "audit": audit}


def _forged(quote: dict[str, Any]) -> dict[str, Any]:
    """The genuine quote with the last byte of its PCR digest changed: the AK signature no longer holds."""
    attest = bytearray(base64.b64decode(quote["attest"]))
    attest[-1] ^= 0x01
    return {**quote, "attest": base64.b64encode(bytes(attest)).decode()}


def test_a_forged_quote_stores_nothing_the_beat_reports(
    cp: ControlPlane, joined: Callable[[str], JoinedNode]
) -> None:
    node = joined("forged-1")
    nonce = node.nonce()
    before = stored(cp, node)
    assert before["state"] == "maintenance" and before["quote_nonce"] == nonce.hex()
    time.sleep(0.05)  # a stored heartbeat time would differ
    answer = node.beat({**FORGED_REPORT, "quote": _forged(node.quote(nonce))})
    assert answer["state"] == "errored" and answer["quote_nonce"] is None, answer
    assert "continuous attestation" in answer["reason"]
    after = stored(cp, node)
    # what the refusal records: the node errored, the nonce spent, one refused line, one transition
    assert after["state"] == "errored" and after["quote_nonce"] is None
    new_lines = after["audit"][len(before["audit"]) :]
    assert [(kind, to) for kind, to, _ in new_lines] == [("join", "refused"), ("node", "errored")], new_lines
    assert "attestation_quote_signature_invalid" in new_lines[0][2]
    # and nothing else: not one of the beat's reports, not its time, not the beat count
    for key in ("inventory", "requirements", "finalize_actual", "last_heartbeat_at", "heartbeats"):
        assert after[key] == before[key], key
    assert after["last_quote_at"] == before["last_quote_at"]
    assert "H100" not in json.dumps(after["inventory"])


def test_a_genuine_quote_stores_the_beat_s_reports(
    cp: ControlPlane, joined: Callable[[str], JoinedNode]
) -> None:
    """The control: the same beat with the quote the TPM made is recorded whole."""
    node = joined("genuine-1")
    nonce = node.nonce()
    before = stored(cp, node)
    time.sleep(0.05)
    answer = node.beat({**FORGED_REPORT, "quote": node.quote(nonce)})
    assert answer["state"] == "maintenance", answer
    after = stored(cp, node)
    assert after["inventory"]["gpus"] == H100S["gpus"]
    assert after["requirements"] == FORGED_REPORT["requirements"]
    assert after["finalize_actual"] == FORGED_REPORT["actual"]["finalize"]
    assert after["last_heartbeat_at"] > before["last_heartbeat_at"]
    assert after["heartbeats"] == before["heartbeats"] + 1
    assert after["last_quote_at"] is not None and after["quote_nonce"] is None
    assert after["audit"] == before["audit"]


def test_a_genuine_quote_over_another_nonce_errors_the_node_and_says_retry_the_node_not_the_join(
    cp: ControlPlane, joined: Callable[[str], JoinedNode]
) -> None:
    """A stale or replayed quote (the node's own TPM, but not over the nonce asked for) is a refusal in a
    heartbeat too; its reason names what the operator does with an errored node, not the join's step."""
    node = joined("stale-1")
    asked = node.nonce()
    answer = node.beat({"actual": {"maintenance": True}, "quote": node.quote(bytes(reversed(asked)))})
    assert answer["state"] == "errored", answer
    assert answer["reason"].startswith("continuous attestation: The quote is not over the nonce"), answer
    assert "provision node retry" in answer["reason"] and "restart the join" not in answer["reason"]
    refused = stored(cp, node)["audit"][-2]
    assert refused[:2] == ("join", "refused") and "provision node retry" in refused[2], refused
