"""The HTTP API of a real server (uvicorn, SQLite): auth, error shape, OpenAPI, pagination."""

from __future__ import annotations

import httpx
import pytest

from tests.fixtures.control_plane import ControlPlane

MID = "0123456789abcdef0123456789abcdef"


def _seed(c: httpx.Client) -> None:
    assert c.post("/v1/providers", json={"kind": "physical"}).status_code == 201
    assert c.post("/v1/regions", json={"name": "lab-1", "provider": "physical"}).status_code == 201
    assert c.post("/v1/nodes", json={"name": "gpu-1", "region": "lab-1", "minion_id": MID}).status_code == 201


def _state(c: httpx.Client) -> list:
    return [
        c.get("/v1/providers").json(),
        c.get("/v1/regions").json(),
        c.get("/v1/nodes", params={"include_removed": True}).json(),
        c.get("/v1/nodes/gpu-1/history").json(),
    ]


def test_openapi_is_public_and_describes_v1(api_server: ControlPlane) -> None:
    doc = httpx.get(f"{api_server.url}/openapi.json").json()
    assert {"/v1/nodes", "/v1/regions", "/v1/providers", "/v1/nodes/{ref}/maintenance"} <= set(doc["paths"])


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer rbo_wrong"}, {"Authorization": "Basic abc"}],
    ids=["missing", "wrong", "not-bearer"],
)
def test_every_v1_route_needs_a_valid_token_and_changes_nothing(
    api_server: ControlPlane, headers: dict
) -> None:
    with api_server.client() as c:
        _seed(c)
        before = _state(c)
    with httpx.Client(base_url=api_server.url, headers=headers) as anon:
        calls = [
            ("GET", "/v1/nodes", None),
            ("GET", "/v1/providers", None),
            ("GET", "/v1/regions/lab-1", None),
            ("POST", "/v1/providers", {"kind": "physical"}),
            ("POST", "/v1/regions", {"name": "x", "provider": "physical"}),
            ("POST", "/v1/nodes", {"name": "g2", "region": "lab-1", "minion_id": "f" * 32}),
            ("POST", "/v1/nodes/gpu-1/maintenance", {"mode": "on"}),
            ("DELETE", "/v1/nodes/gpu-1", None),
            ("DELETE", "/v1/regions/lab-1?force=true", None),
            ("POST", "/v1/nodes", {"bad": "body"}),
        ]
        for method, path, body in calls:
            r = anon.request(method, path, json=body)
            assert r.status_code == 401, (method, path, r.text)
            assert (
                r.json()["code"] in {"token_missing", "token_invalid"}
                and r.headers["www-authenticate"] == "Bearer"
            )
    with api_server.client() as c:
        assert _state(c) == before


def test_errors_are_json_with_code_and_one_line(api_server: ControlPlane) -> None:
    with api_server.client() as c:
        _seed(c)
        cases = [
            (
                c.post("/v1/nodes", json={"name": "gpu-2", "region": "lab-1", "minion_id": MID}),
                409,
                "duplicate_minion_id",
            ),
            (c.post("/v1/nodes", json={"name": "x"}), 422, "invalid_input"),
            (c.get("/v1/nodes/ghost"), 404, "node_not_found"),
            (c.get("/v1/nodes", params={"limit": 501}), 422, "invalid_input"),
            (c.post("/v1/nodes/gpu-1/maintenance", json={"mode": "off"}), 409, "node_not_ready"),
            (c.get("/v1/nothing-here"), 404, "not_found"),
        ]
        for response, status, code in cases:
            body = response.json()
            assert (response.status_code, body["code"]) == (status, code), body
            assert set(body) == {"code", "message"} and "\n" not in body["message"]


def test_node_output_has_state_and_derived_online(api_server: ControlPlane) -> None:
    with api_server.client() as c:
        _seed(c)
        node = c.get("/v1/nodes/gpu-1").json()
        assert node["state"] == "new" and node["online"] is False and node["last_heartbeat_at"] is None
        assert {"inventory", "requirements", "version", "region", "minion_id"} <= set(node)
        page = c.get("/v1/nodes", params={"limit": 1}).json()
        assert [n["name"] for n in page["items"]] == ["gpu-1"] and page["next"] is None
