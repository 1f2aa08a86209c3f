"""LeanRoute (provisioner/api/lean_route.py) answers every request as FastAPI's own APIRoute answers it: the
same endpoint mounted both ways, the same requests, the same statuses and bodies. And it refuses, when
the route is built, an endpoint or an inclusion whose dependencies it would skip."""

from __future__ import annotations

import json
from typing import Annotated, Any

import pytest
from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from contracts.messages import HeartbeatRequest
from provisioner.api import errors
from provisioner.api.deps import NODE_CREDENTIAL, Credentials
from provisioner.api.lean_route import LeanRoute

PATH = "/v1/nodes/{node_id}/heartbeat"


async def echo(
    node_id: str,
    body: HeartbeatRequest,
    request: Request,
    bearer: Annotated[Credentials, Depends(NODE_CREDENTIAL)],
) -> Response:
    """What the endpoint was given, as JSON."""
    said = {
        "node_id": node_id,
        "body": body.model_dump(mode="json"),
        "bearer": bearer.credentials if bearer else None,
        "client": request.client.host if request.client else None,
    }
    return Response(json.dumps(said), media_type="application/json")


def client(route_class: type[APIRoute], dependencies: list[Any] | None = None) -> TestClient:
    router = APIRouter()
    router.add_api_route(PATH, echo, methods=["POST"], route_class_override=route_class)
    app = FastAPI()
    errors.install(app)
    app.include_router(router, dependencies=dependencies)
    return TestClient(app)


GOOD = b'{"version": 1, "actual": {"maintenance": true}, "desired_revision": "abc"}'
JSON = {"content-type": "application/json"}
CREDENTIAL = {"authorization": "Bearer rbn_secret"}

CASES: dict[str, tuple[bytes, dict[str, str]]] = {
    "a beat": (GOOD, JSON | CREDENTIAL),
    "no credential": (GOOD, JSON),
    "a credential of another scheme": (GOOD, JSON | {"authorization": "Basic dXNlcjpwYXNz"}),
    "a +json media type with a charset": (
        GOOD,
        {"content-type": "application/vnd.rigbase+json; charset=utf-8"} | CREDENTIAL,
    ),
    "invalid JSON": (b'{"version": 1,', JSON | CREDENTIAL),
    "bytes that are not UTF-8 (found by the API fuzzer)": (b"\xff\x13\xfe", JSON | CREDENTIAL),
    "no body": (b"", JSON | CREDENTIAL),
    "no Content-Type": (GOOD, CREDENTIAL),
    "text/plain": (GOOD, {"content-type": "text/plain"} | CREDENTIAL),
    "a JSON array": (b"[1, 2]", JSON | CREDENTIAL),
    "an unknown key": (b'{"actual": {}, "surprise": 1}', JSON | CREDENTIAL),
    "a value of the wrong type": (b'{"actual": "none"}', JSON | CREDENTIAL),
    "NaN, which Python's json takes": (b'{"version": NaN, "actual": {}}', JSON | CREDENTIAL),
    "a report nested too deep": (b'{"actual": {"a": [[[[[[[[[1]]]]]]]]]}}', JSON | CREDENTIAL),
}


@pytest.mark.parametrize("case", CASES)
def test_the_lean_route_answers_as_fastapi_does(case: str) -> None:
    body, headers = CASES[case]
    path = PATH.format(node_id="node_abc")
    fastapi_answer = client(APIRoute).post(path, content=body, headers=headers)
    lean_answer = client(LeanRoute).post(path, content=body, headers=headers)
    assert (lean_answer.status_code, lean_answer.json()) == (
        fastapi_answer.status_code,
        fastapi_answer.json(),
    )
    if case == "a beat":
        assert lean_answer.json()["bearer"] == "rbn_secret" and lean_answer.json()["node_id"] == "node_abc"
    elif case in ("invalid JSON", "no body", "an unknown key"):
        assert lean_answer.status_code == 422 and lean_answer.json()["code"] == "invalid_input"


def test_a_dependency_around_the_route_is_refused_not_skipped() -> None:
    async def guard() -> None:
        raise AssertionError("never reached")

    with pytest.raises(TypeError, match="would skip its dependencies"):
        client(LeanRoute, dependencies=[Depends(guard)]).post(PATH.format(node_id="n"), content=GOOD)


def test_an_endpoint_taking_more_than_the_route_gives_is_refused() -> None:
    async def wants_a_session(node_id: str, body: HeartbeatRequest, request: Request, session: int) -> None:
        return None

    router = APIRouter()
    with pytest.raises(TypeError, match="must take its path parameters"):
        router.add_api_route(PATH, wants_a_session, methods=["POST"], route_class_override=LeanRoute)
