"""Through the real `provision` against a real server: `--wait` prints the id
first and, on a timeout, says whether the minion ever called and the full next command; join tokens show
`expired`, one can be revoked by id, `region bundle` says until when its media enrol nodes and writes to
stdout with `-o -`; `-` reads stdin where a file is read."""

from __future__ import annotations

import json
import sqlite3

from tests.fixtures.control_plane import ControlPlane
from tests.provisioner.test_join_http import api

MINION = "ab" * 16


def _ok(cp: ControlPlane, *args: str, input: str | None = None) -> str:
    out = cp.provision(*args, input=input)
    assert out.returncode == 0, (args, out.stdout, out.stderr)
    return out.stdout


def _region(cp: ControlPlane) -> None:
    api(cp, "POST", "/v1/providers", {"kind": "physical", "config": {}})
    api(cp, "POST", "/v1/regions", {"name": "lab", "provider": "physical"})


def test_wait_prints_the_id_first_and_explains_a_timeout(api_server: ControlPlane) -> None:
    cp = api_server
    _region(cp)
    out = cp.provision(
        "node", "add", "gpu-1", "--region", "lab", "--minion-id", MINION, "--wait", "--timeout", "2"
    )
    assert out.returncode == 1
    node_id = out.stdout.strip()
    assert node_id.startswith("node_") and len(out.stdout.splitlines()) == 1
    error = out.stderr.strip().splitlines()[-1]
    assert error.startswith("error: node 'gpu-1'") and "is still new after" in error
    assert f"its minion {MINION} has never called the control plane" in error
    assert "`provision node show gpu-1 --region lab --watch`" in error
    assert "provision region bundle lab" in error
    # the minion calls with a token that is no token: refused, audited; the timeout now says so and why
    with cp.client() as client:
        refused = client.post("/v1/join", json={"minion_id": MINION, "join_token": "rbj_nope"})
    assert refused.status_code in (403, 422), refused.text
    rows = api(cp, "GET", f"/v1/join-refusals?minion_id={MINION}")["items"]
    assert rows, "the refused join is in the audit trail"
    out = cp.provision("node", "show", "gpu-1", "-o", "json")
    assert json.loads(out.stdout)["id"] == node_id
    again = cp.provision(
        "node", "replace", "gpu-1", "--minion-id", MINION, "--yes", "--wait", "--timeout", "1"
    )  # not a storage node: refused before any wait, one line
    assert again.returncode != 0 and len(again.stderr.strip().splitlines()) == 1
    api(cp, "DELETE", "/v1/nodes/gpu-1?region=lab")
    out = cp.provision(
        "node", "add", "gpu-2", "--region", "lab", "--minion-id", MINION, "--wait", "--timeout", "1"
    )
    assert out.returncode == 1 and out.stdout.strip().startswith("node_")
    error = out.stderr.strip().splitlines()[-1]
    assert f"its minion {MINION} called and was refused at" in error, error
    assert rows[0]["reason"][:40] in error
    assert f"`provision node refusals --minion-id {MINION}`" in error


def test_join_tokens_expired_revoke_one_and_bundle(api_server: ControlPlane) -> None:
    cp = api_server
    _region(cp)
    first = api(cp, "POST", "/v1/regions/lab/join-tokens", {"ttl": "1h"})
    second = api(cp, "POST", "/v1/regions/lab/join-tokens", {"ttl": "7d"})
    db = sqlite3.connect(cp.home / "rigbase.db")
    with db:
        db.execute("UPDATE join_tokens SET expires_at = '2020-01-01 00:00:00' WHERE id = ?", (first["id"],))
    db.close()
    listed = {t["id"]: t for t in json.loads(_ok(cp, "region", "join-token", "lab", "--list", "-o", "json"))}
    assert listed[first["id"]]["state"] == "expired" and listed[second["id"]]["state"] == "issued"
    table = _ok(cp, "region", "join-token", "lab", "--list")
    assert "expired" in table and "ago" in table and "in 6d" in table
    # one token revoked by id; the other stays; revoking it again changes nothing and says so
    assert "is revoked" in _ok(cp, "region", "join-token", "lab", "--revoke", second["id"])
    assert "is revoked" in _ok(cp, "region", "join-token", "lab", "--revoke", second["id"])
    states = {t["id"]: t["state"] for t in api(cp, "GET", "/v1/regions/lab/join-tokens")["items"]}
    assert states == {first["id"]: "expired", second["id"]: "revoked"}
    unknown = cp.provision("region", "join-token", "lab", "--revoke", "jt_nope")
    assert unknown.returncode == 1 and "--list" in unknown.stderr
    assert len(unknown.stderr.strip().splitlines()) == 1
    # the audit trail has the revocation
    assert "revoked 1 join token(s)" in _ok(cp, "region", "join-token", "lab", "--revoke-all")
    # bundle: to stdout with -o -, and how long its media enrol nodes on stderr
    url = "https://cp.example:8470"
    out = cp.provision("region", "bundle", "lab", "-o", "-", "--ttl", "2d", "--control-plane-url", url)
    assert out.returncode == 0, out.stderr
    bundle = json.loads(out.stdout)
    assert bundle["region"] == "lab" and bundle["join_token"].startswith("rbj_")
    assert f"until {bundle['expires_at']}" in out.stderr and "(in 1d)" in out.stderr
    # `-` reads stdin where a file is read: the CA certificate of the bundle
    pem = "-----BEGIN CERTIFICATE-----\nnot really\n-----END CERTIFICATE-----\n"
    out = cp.provision(
        "region", "bundle", "lab", "-o", "-", "--control-plane-url", url, "--ca-certificate", "-", input=pem
    )
    if out.returncode == 0:
        assert json.loads(out.stdout)["ca_certificate"] == pem
    else:  # the server checks the PEM: what matters is that stdin was read, not "cannot read -"
        assert "cannot read" not in out.stderr
    missing = cp.provision(
        "region",
        "bundle",
        "lab",
        "-o",
        "-",
        "--control-plane-url",
        url,
        "--ca-certificate",
        "/nonexistent.pem",
    )
    assert missing.returncode == 2 and "or - to read it from stdin" in missing.stderr


def test_password_file_from_stdin(api_server: ControlPlane) -> None:
    cp = api_server
    _region(cp)
    out = cp.provision(
        "datastore",
        "add",
        "nas",
        "--region",
        "lab",
        "--type",
        "smb",
        "--address",
        "192.0.2.10",
        "--root",
        "/share",
        "--username",
        "me",
        "--password-file",
        "-",
        input="s3cret\n",
    )
    assert out.returncode == 0, out.stderr
    shown = json.loads(_ok(cp, "datastore", "show", "nas", "--region", "lab", "-o", "json"))
    assert shown["username"] == "me" and "s3cret" not in json.dumps(shown)


def test_bundles_carry_the_regions_live_bundle_token_until_a_new_one_is_asked_for(
    api_server: ControlPlane,
) -> None:
    cp = api_server
    _region(cp)
    url = "https://cp.example:8470"

    def bundle(*more: str) -> tuple[dict, str]:
        out = cp.provision("region", "bundle", "lab", "-o", "-", "--control-plane-url", url, *more)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout), out.stderr

    shown_once = api(cp, "POST", "/v1/regions/lab/join-tokens", {"ttl": "30d"})  # kept as a hash only
    first, said = bundle()
    assert first["join_token"] != shown_once["token"] and said.startswith("a new join token (jtk_")
    again, said = bundle()
    assert again["join_token"] == first["join_token"] and again["expires_at"] == first["expires_at"]
    assert said.startswith("the region's live join token (jtk_") and "(in 6d)" in said
    tokens = api(cp, "GET", "/v1/regions/lab/join-tokens")["items"]
    assert len(tokens) == 2  # the one shown once and the bundles' one: no token per bundle
    # the sealed token is not the token: a copied database alone does not give it away
    db = sqlite3.connect(cp.home / "rigbase.db")
    (sealed,) = db.execute("SELECT sealed_token FROM join_tokens WHERE sealed_token IS NOT NULL").fetchone()
    assert first["join_token"] not in sealed
    # --new-token and --ttl make new ones; the newest live one is carried next
    fresh, said = bundle("--new-token")
    assert fresh["join_token"] != first["join_token"] and said.startswith("a new join token")
    longer, _ = bundle("--ttl", "30d")
    assert longer["join_token"] not in (first["join_token"], fresh["join_token"])
    assert bundle()[0]["join_token"] == longer["join_token"]
    # a live token that enrols for less than a day more is not put on new media
    with db:
        db.execute(
            "UPDATE join_tokens SET expires_at = datetime('now', '+2 hours') WHERE sealed_token IS NOT NULL"
        )
    db.close()
    soon, said = bundle()
    assert soon["join_token"] not in (first["join_token"], fresh["join_token"], longer["join_token"])
    assert said.startswith("a new join token")
    # revoked: never carried again
    _ok(cp, "region", "join-token", "lab", "--revoke-all")
    after, said = bundle()
    assert after["join_token"] != soon["join_token"] and said.startswith("a new join token")
