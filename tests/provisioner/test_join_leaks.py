"""Nothing a request says about a minion is stored before its proof of possession succeeds: a refused step 1
of a join — failing requirements, a bad join token, a malformed body — or a proof its
TPM did not make leaves an attested pending minion exactly as it was; the refusal is only in the audit
trail. Real `provision serve` (SQLite), real swtpms, the minion's own message builders."""

from __future__ import annotations

import base64
import sqlite3
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from provisioner.lab.swtpm import VendorCA
from tests.fixtures.control_plane import ControlPlane
from tests.fixtures.joins import joinable_control_plane
from tests.provisioner.test_join_http import H100S, Minion, api, minion, token

__all__ = ["minion"]  # the swtpm minion fixture of test_join_http, used here against this module's `cp`

FAILING = {"ok": False, "rules": [{"rule": "gpu_count", "ok": False}]}


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory, tpm_vendor_ca: VendorCA) -> Iterator[ControlPlane]:
    with joinable_control_plane(
        tmp_path_factory, tpm_vendor_ca, "leak", [["region", "create", "lab", "--provider", "physical"]]
    ) as server:
        yield server


def pending_row(cp: ControlPlane, minion_id: str) -> tuple[Any, ...]:
    """Everything stored about a pending minion, straight from the store."""
    db = sqlite3.connect(cp.database_url.removeprefix("sqlite:///"))
    try:
        row = db.execute("SELECT * FROM pending_minions WHERE minion_id = ?", (minion_id,)).fetchone()
    finally:
        db.close()
    assert row is not None, f"{minion_id} is not pending"
    return tuple(row)


def refusal_codes(cp: ControlPlane, minion_id: str) -> list[str]:
    items = api(cp, "GET", f"/v1/join-refusals?minion_id={minion_id}&limit=500")["items"]
    return [str(item["reason"]) for item in items]


def test_refused_requests_leave_an_attested_pending_minion_as_it_was(
    cp: ControlPlane, minion: Callable[..., Minion]
) -> None:
    m = minion()
    jt = token(cp)
    assert m.join(jt).status_code == 202  # attested, waiting for `provision node add`
    before = pending_row(cp, m.minion_id)
    listed_before = [
        p for p in api(cp, "GET", "/v1/pending-minions")["items"] if p["minion_id"] == m.minion_id
    ]

    refused = {
        # a valid token, a report of failing hardware: the report is unproven
        "join_requirements_failed": m.begin(jt, requirements=FAILING, inventory=H100S),
        # no valid token at all
        "join_token_invalid": m.begin("rbj_" + "x" * 40, inventory=H100S),
        # a body that is not a JoinRequest, naming the minion
        "attestation_malformed_request": m.begin(jt, ek_public=12),
    }
    for code, response in refused.items():
        assert response.status_code in (401, 403, 422), (code, response.text)
        assert response.json()["code"] == code, response.text
    # a proof its TPM did not make (anyone knowing the EK can send one): refused, and transient
    challenge = m.begin(jt, inventory=H100S).json()
    body = m.proof_body(challenge)
    body["activated_secret"] = base64.b64encode(b"\x00" * 32).decode()
    wrong = m.prove(challenge, jt, body)
    assert wrong.json()["code"] == "attestation_wrong_secret", wrong.text

    assert pending_row(cp, m.minion_id) == before
    listed = [p for p in api(cp, "GET", "/v1/pending-minions")["items"] if p["minion_id"] == m.minion_id]
    assert listed == listed_before and listed[0]["refusal"] is None and "H100" not in str(listed)
    # the operator still reads every refusal in the audit trail
    reasons = " ".join(refusal_codes(cp, m.minion_id))
    for code in [*refused, "attestation_wrong_secret"]:
        assert code in reasons, (code, reasons)
    # and the real TPM's next join replaces the listing with what it proves
    assert m.join(jt).status_code == 202
    assert pending_row(cp, m.minion_id) != before


def test_an_unattested_listing_takes_refusals_only_from_token_holders(
    cp: ControlPlane, minion: Callable[..., Minion]
) -> None:
    m = minion()
    jt = token(cp)
    refused = m.begin(jt, requirements=FAILING)
    assert refused.json()["code"] == "join_requirements_failed", refused.text
    before = pending_row(cp, m.minion_id)
    listed = next(p for p in api(cp, "GET", "/v1/pending-minions")["items"] if p["minion_id"] == m.minion_id)
    assert listed["attested"] is False and "gpu_count" in str(listed["refusal"])
    # without a join token nothing about it changes, not even its last refusal
    assert m.begin("rbj_" + "x" * 40).json()["code"] == "join_token_invalid"
    assert m.begin(jt, ek_public=12).json()["code"] == "attestation_malformed_request"
    assert pending_row(cp, m.minion_id) == before
