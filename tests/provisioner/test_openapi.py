"""The API description served by a real control plane (docs/control-plane.md, "API"): every route says
which credential it needs and which errors it answers with, in the `{code, message}` shape the server
really sends; only /openapi.json and /healthz are public (no /docs or /redoc pages)."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from tests.fixtures.control_plane import ControlPlane

ERROR_OUT = {"$ref": "#/components/schemas/ErrorOut"}
# POST /v1/join carries its join token in the body: the one /v1/ operation without a security requirement.
UNAUTHENTICATED = {("post", "/v1/join")}


@pytest.fixture
def document(api_server: ControlPlane) -> dict[str, Any]:
    answer = httpx.get(f"{api_server.url}/openapi.json", timeout=30)
    assert answer.status_code == 200
    return answer.json()


def _operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method, path, op)
        for path, item in document["paths"].items()
        if path.startswith("/v1/")
        for method, op in item.items()
    ]


def _error_schema(op: dict[str, Any], status: int) -> dict[str, Any] | None:
    response = op["responses"].get(str(status))
    return response["content"]["application/json"]["schema"] if response else None


def test_the_three_bearer_credentials_are_security_schemes(document: dict[str, Any]) -> None:
    schemes = document["components"]["securitySchemes"]
    assert set(schemes) == {"operatorToken", "nodeCredential", "joinToken"}
    assert all(s == {**s, "type": "http", "scheme": "bearer"} for s in schemes.values())


def test_every_v1_operation_states_its_credential_and_its_errors(document: dict[str, Any]) -> None:
    operations = _operations(document)
    assert len(operations) > 40
    for method, path, op in operations:
        where = f"{method.upper()} {path}"
        if (method, path) in UNAUTHENTICATED:
            assert "security" not in op, where
            assert "join token" in op["description"] and "body" in op["description"], where
        else:
            assert op.get("security"), where
            assert _error_schema(op, 401) == ERROR_OUT, where
            assert _error_schema(op, 429) == ERROR_OUT, where
        if "requestBody" in op or op.get("parameters"):
            assert _error_schema(op, 422) == ERROR_OUT, where
        if "requestBody" in op:
            assert _error_schema(op, 413) == ERROR_OUT, where
        if any(p["in"] == "path" for p in op.get("parameters", [])):
            assert _error_schema(op, 404) == ERROR_OUT, where
    assert "HTTPValidationError" not in document["components"]["schemas"]


def test_each_minion_route_names_its_own_credential(document: dict[str, Any]) -> None:
    paths = document["paths"]
    assert paths["/v1/join/{join_id}/proof"]["post"]["security"] == [{"joinToken": []}]
    assert paths["/v1/nodes/{node_id}/heartbeat"]["post"]["security"] == [{"nodeCredential": []}]
    assert paths["/v1/nodes"]["get"]["security"] == [{"operatorToken": []}]


def test_the_documented_error_shape_is_what_the_server_sends(
    api_server: ControlPlane, document: dict[str, Any]
) -> None:
    error_out = document["components"]["schemas"]["ErrorOut"]
    assert set(error_out["required"]) == {"code", "message"}
    with api_server.client() as client:
        answer = client.get("/v1/nodes", params={"limit": "many"})
    assert answer.status_code == 422
    assert set(answer.json()) == {"code", "message"}


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_there_are_no_public_docs_pages(api_server: ControlPlane, page: str) -> None:
    assert httpx.get(f"{api_server.url}{page}", timeout=30).status_code == 404


def test_no_operator_route_answers_a_minion_routes_method_and_path() -> None:
    """The app tries the minion's routes first (the heartbeat is most of a fleet's traffic); that order
    may change no answer, so no operator route may match a method and path a minion route matches."""
    from provisioner.api.app import FLEET_ROUTERS, OPEN_ROUTERS, OPERATOR_ROUTERS

    def concrete(path: str) -> str:  # a path the route itself matches, each parameter filled in
        return re.sub(r"\{[^}]+\}", "x1", path)

    minion = [
        (route, m)
        for router in OPEN_ROUTERS
        for route in router.routes
        for m in getattr(route, "methods", ())
    ]
    operator = [
        (route, m)
        for router in OPERATOR_ROUTERS + FLEET_ROUTERS
        for route in router.routes
        for m in route.methods
    ]
    assert len(minion) >= 7 and len(operator) >= 90
    clashes = [
        (m, a.path, b.path)
        for a, m in minion
        for b, n in operator
        if m == n and (a.path_regex.match(concrete(b.path)) or b.path_regex.match(concrete(a.path)))
    ]
    assert clashes == []


def _integer_schema(parameter: dict[str, Any]) -> dict[str, Any] | None:
    schema = parameter["schema"]
    return next((s for s in (schema, *schema.get("anyOf", ())) if s.get("type") == "integer"), None)


def test_every_integer_parameter_is_bounded_and_past_its_bound_is_a_422(
    api_server: ControlPlane, document: dict[str, Any]
) -> None:
    """The store holds 32- and 64-bit integers: a number past them, asked for or written, failed in the
    driver (the API fuzzer found `GET /v1/jobs/{ref}/logs?offset=14089785198536052736` answering 500,
    OverflowError). Every integer query and path parameter declares its upper bound, and one past it is
    refused at the door (422) on every GET that takes one, whatever the resource."""
    checked: list[str] = []
    with api_server.client() as client:
        for method, path, op in _operations(document):
            for parameter in op.get("parameters", []):
                schema = _integer_schema(parameter)
                if schema is None:
                    continue
                label = f"{method.upper()} {path} {parameter['name']}"
                end = schema.get("exclusiveMaximum", schema.get("maximum", -1) + 1)
                assert end > 0, f"{label}: an integer parameter without an upper bound"
                if method != "get" or parameter["in"] != "query":
                    continue  # (the one path integer is a minion's POST: its own test's)
                url = re.sub(r"\{[^}]+\}", "absent", path)
                answer = client.get(url, params={parameter["name"]: end})
                assert answer.status_code == 422, (label, answer.status_code, answer.text[:300])
                assert answer.json()["code"] == "invalid_input", answer.text
                checked.append(label)
    assert len(checked) >= 7, checked
