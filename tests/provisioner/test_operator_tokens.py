"""Operator tokens through the real CLI and a real `provision serve`: create prints the id and the secret
once; the token works at once and its last use is shown; rotation and revocation take effect on the very
next request; an expired token is refused with a reason; the last live token cannot be revoked; bad input is
one line with nothing stored (exit 2: usage)."""

from __future__ import annotations

import json
import time

import httpx

from tests.fixtures.control_plane import ControlPlane


def _as(cp: ControlPlane, token: str) -> httpx.Client:
    client = cp.client()
    client.headers["Authorization"] = f"Bearer {token}"
    return client


def _ok(cp: ControlPlane, *args: str) -> str:
    out = cp.provision(*args)
    assert out.returncode == 0, (args, out.stdout, out.stderr)
    return out.stdout


def test_create_use_rotate_revoke(api_server: ControlPlane) -> None:
    cp = api_server
    token_id, secret = _ok(cp, "token", "create", "ci-robot").split()
    assert token_id.startswith("tok_") and secret.startswith("rbo_")
    with _as(cp, secret) as robot:
        assert robot.get("/v1/providers").status_code == 200
    listed = {t["name"]: t for t in json.loads(_ok(cp, "token", "list", "--json"))}
    assert listed["ci-robot"]["state"] == "live" and listed["ci-robot"]["last_used_at"]
    assert all(t["token"] is None for t in listed.values())  # secrets never listed

    # rotate: the old secret is refused on the next request, the new one works
    rotated = json.loads(_ok(cp, "token", "rotate", "ci-robot", "--json"))
    assert rotated["id"] == token_id and rotated["token"] != secret
    with _as(cp, secret) as old, _as(cp, rotated["token"]) as new:
        assert old.get("/v1/providers").status_code == 401
        assert new.get("/v1/providers").status_code == 200
        # revoke: refused from the next request on, with a reason that says what to do
        _ok(cp, "token", "revoke", "ci-robot", "--yes")
        refused = new.get("/v1/providers")
        assert refused.status_code == 401 and refused.json()["code"] == "token_revoked"
        assert "token create" in refused.json()["message"]
    with cp.client() as admin:
        assert admin.get("/v1/providers").status_code == 200  # the admin token is untouched


def test_expiry_and_the_last_live_token(api_server: ControlPlane) -> None:
    cp = api_server
    _token_id, secret = _ok(cp, "token", "create", "short", "--ttl", "1s").split()
    time.sleep(1.2)
    with _as(cp, secret) as short:
        expired = short.get("/v1/providers")
    assert expired.status_code == 401 and expired.json()["code"] == "token_expired"
    assert json.loads(_ok(cp, "token", "show", "short", "--json"))["state"] == "expired"

    # the admin is the only live token left: revoking it would lock every operator out
    before = _ok(cp, "token", "list", "--json")
    out = cp.provision("token", "revoke", "admin", "--yes")
    assert out.returncode == 1 and out.stderr.count("\n") == 1 and "last live operator token" in out.stderr
    for bad, words in ((("create", "Bad Name"), "is not valid"), (("create", "x", "--ttl", "9y"), "TTL")):
        out = cp.provision("token", *bad)
        assert out.returncode == 2 and words in out.stderr and out.stderr.count("\n") == 1, out.stderr
    assert _ok(cp, "token", "list", "--json") == before
