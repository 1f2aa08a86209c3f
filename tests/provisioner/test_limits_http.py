"""Request limits of a real server: body caps and auth before the body (413/401),
bounded node reports (422), a node list that survives what is already stored, escaped and bounded audit
reasons, and per-source rate limits on failed authentications (429). Different sources are different
127.0.0.x addresses: the client binds its end of the connection there."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import sqlalchemy as sa

from tests.fixtures.control_plane import ControlPlane

WIRE = Path(__file__).resolve().parents[1] / "contracts" / "wire_v1"
MID = "0123456789abcdef0123456789abcdef"
WELL_FORMED = {
    "operator": "rbo_" + "x" * 43,
    "node": "rbn_" + "x" * 43,
    "join": "rbj_" + "x" * 43,
}


def _raw(cp: ControlPlane, head: str, body: bytes = b"", source: str = "127.0.0.1") -> tuple[int, bytes]:
    """Send `head` (and `body`) on a plain socket, return the status and what came back. Used where the
    client must NOT send the whole body: the server has to answer without it."""
    url = urlsplit(cp.url)
    raw = socket.create_connection((url.hostname, url.port), timeout=5, source_address=(source, 0))
    with cp.verify.wrap_socket(raw, server_hostname=url.hostname) as s:  # the server speaks TLS only
        s.sendall(head.replace("\n", "\r\n").encode() + b"\r\n" + body)
        data = b""
        while not _complete(data):
            chunk = s.recv(65536)  # a socket.timeout here: the server waited for the body
            if not chunk:
                break
            data += chunk
    return int(data.split(b" ", 2)[1]), data


def _complete(data: bytes) -> bool:
    head, sep, body = data.partition(b"\r\n\r\n")
    lengths = [
        line.split(b":")[1] for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:")
    ]
    return bool(sep) and len(body) >= int(lengths[0] if lengths else 0)


def _client(cp: ControlPlane, source: str, token: str | None = None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    transport = httpx.HTTPTransport(local_address=source)
    return httpx.Client(base_url=cp.url, headers=headers, transport=transport, timeout=30)


def _one_line_error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"code", "message"} and "\n" not in body["message"], body
    return body


def test_an_unauthenticated_50_mb_body_is_refused_before_it_is_sent(api_server: ControlPlane) -> None:
    big = 50 * 1024 * 1024
    for path in ("/v1/regions", "/v1/nodes/n-1/heartbeat", "/v1/join/j-1/proof", "/v1/images"):
        status, answer = _raw(
            api_server,
            f"POST {path} HTTP/1.1\nHost: x\nContent-Type: application/json\nContent-Length: {big}\n",
        )
        assert status == 401, (path, answer)
        assert b"WWW-Authenticate" in answer or b"www-authenticate" in answer
    # a token of the right form but a body over the route's cap: 413, still without reading it
    for path, kind in (("/v1/regions", "operator"), ("/v1/nodes/n-1/heartbeat", "node")):
        status, answer = _raw(
            api_server,
            f"POST {path} HTTP/1.1\nHost: x\nAuthorization: Bearer {WELL_FORMED[kind]}\n"
            f"Content-Type: application/json\nContent-Length: {big}\n",
        )
        assert status == 413, (path, answer)
    status, _ = _raw(api_server, f"POST /v1/join HTTP/1.1\nHost: x\nContent-Length: {big}\n")
    assert status == 413


def test_a_chunked_body_is_read_only_up_to_the_cap(api_server: ControlPlane) -> None:
    chunk = b"x" * 4096
    # 512 KiB: over the proof's cap (a quote and a firmware event log of at most 256 KiB)
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(128)) + b"0\r\n\r\n"
    status, answer = _raw(
        api_server,
        f"POST /v1/join/j-1/proof HTTP/1.1\nHost: x\nAuthorization: Bearer {WELL_FORMED['join']}\n"
        "Transfer-Encoding: chunked\nContent-Type: application/json\n",
        body,
    )
    assert status == 413, answer
    assert b'"code":"body_too_large"' in answer.replace(b" ", b"")


def test_health_and_openapi_stay_public(api_server: ControlPlane) -> None:
    assert httpx.get(f"{api_server.url}/healthz").status_code == 200
    assert httpx.get(f"{api_server.url}/openapi.json").status_code == 200


def _join_request(**changes: object) -> dict:
    return {**json.loads((WIRE / "join_request.json").read_text()), **changes}


def _deep(levels: int) -> dict:
    value: dict = {}
    for _ in range(levels):
        value = {"a": value}
    return value


def test_node_reports_are_bounded_in_size_and_depth(api_server: ControlPlane) -> None:
    with _client(api_server, "127.0.0.1") as c:
        for inventory, why in (
            (_deep(20), "nested deeper than 8"),
            ({"blob": "x" * 40_000}, "more than the 32768"),
        ):
            r = c.post("/v1/join", json=_join_request(inventory=inventory))
            body = _one_line_error(r, 422)
            assert "inventory" in body["message"] and why in body["message"], body
        # a real report passes the bounds (and then fails on its unknown join token, as it should)
        assert c.post("/v1/join", json=_join_request()).status_code == 403


def test_the_node_list_survives_a_deep_report_already_stored(api_server: ControlPlane) -> None:
    with api_server.client() as c:
        assert c.post("/v1/providers", json={"kind": "physical"}).status_code == 201
        assert c.post("/v1/regions", json={"name": "lab-1", "provider": "physical"}).status_code == 201
        assert (
            c.post("/v1/nodes", json={"name": "gpu-1", "region": "lab-1", "minion_id": MID}).status_code
            == 201
        )
        engine = sa.create_engine(api_server.database_url)
        with engine.begin() as db:  # as an older control plane could have stored it
            db.execute(sa.text("UPDATE nodes SET inventory = :v"), {"v": json.dumps(_deep(300))})
        engine.dispose()
        listed = c.get("/v1/nodes")
        assert listed.status_code == 200, listed.text
        assert "unreadable" in listed.json()["items"][0]["inventory"]
        shown = c.get("/v1/nodes/gpu-1")
        assert shown.status_code == 200 and "unreadable" in shown.json()["inventory"]
    assert api_server.provision("node", "list").returncode == 0


def test_refusal_reasons_are_escaped_bounded_and_not_flooded(api_server: ControlPlane) -> None:
    forged = "x\n2026-01-01 00:00  gpu-9  FORGED join accepted"
    with _client(api_server, "127.0.0.3") as c:
        assert c.post("/v1/join", json=_join_request(**{forged: 1})).status_code == 422
        assert c.post("/v1/join", json=_join_request(**{"k" * 60_000: 1})).status_code == 422
        answers = [c.post("/v1/join", json={"junk": i}).status_code for i in range(80)]
    assert 429 in answers and set(answers) == {422, 429}, answers
    with api_server.client() as c:
        rows = c.get("/v1/join-refusals", params={"limit": 500}).json()["items"]
    assert len(rows) <= 50  # the source's failure budget: beyond it, nothing is recorded
    assert all("\n" not in r["reason"] and len(r["reason"]) <= 2100 for r in rows)
    assert any("\\n2026-01-01" in r["reason"] for r in rows)
    out = api_server.provision("node", "refusals", "--limit", "500")
    assert out.returncode == 0, out.stderr
    assert not any(line.lstrip("│| ").startswith("2026-01-01") for line in out.stdout.splitlines())


def test_failed_authentications_are_rate_limited_per_source(api_server: ControlPlane) -> None:
    for token in ("rbo_wrong", WELL_FORMED["operator"]):
        source = "127.0.0.2" if token == "rbo_wrong" else "127.0.0.4"
        with _client(api_server, source, token) as attacker:
            answers = []
            for _ in range(300):
                r = attacker.get("/v1/nodes")
                answers.append(r.status_code)
                if r.status_code == 429:
                    break
        assert answers[:-1] == [401] * 50 and answers[-1] == 429, answers
        body = _one_line_error(r, 429)
        assert body["code"] == "rate_limited" and int(r.headers["Retry-After"]) >= 1
        # the right token from the same address waits too; from another address it is served
        with _client(api_server, source, api_server.token) as same:
            assert same.get("/v1/nodes").status_code == 429
    with api_server.client() as c:
        assert c.get("/v1/nodes").status_code == 200
    with _client(api_server, "127.0.0.5", WELL_FORMED["node"]) as node:
        answers = [node.post("/v1/nodes/n-1/heartbeat", json={}).status_code for _ in range(60)]
    assert answers[:50] == [401] * 50 and set(answers[50:]) == {429}


def test_a_path_with_an_encoded_newline_is_an_ordinary_refusal(api_server: ControlPlane) -> None:
    """Found by the fuzzer: the policy table did not match a decoded path holding a newline (500)."""
    with api_server.client() as client:
        for path in ("/v1/providers/a%0Ab", "/v1/datastores/x%0A", "/nowhere%0A"):
            response = client.get(path)
            assert response.status_code in (404, 422) and response.json()["code"], (path, response.text)
