"""LeanRoute: a FastAPI route documented from its endpoint like any other, but served without FastAPI's
per-request machinery (solving the dependency graph, validating the parsed body again, the telemetry
hooks): a fleet's heartbeats are most of the requests, and skipping it saved 3 to 11 % of a beat's CPU
in process (interleaved runs of the heartbeat's ASGI app on PostgreSQL).

The endpoint it serves takes only what the route handler can give it directly, checked when the route
is built:
- its path parameters, as strings, by name;
- `body`: one pydantic model, read as FastAPI reads a JSON body (the same 422 answers: a missing body,
  a body not sent as JSON, invalid JSON, a model refusing it);
- `request`: the Starlette request;
- `bearer`: an HTTPBearer scheme's credentials (`Annotated[Credentials, Depends(SCHEME)]`), or None.
"""

from __future__ import annotations

import inspect
import json
import typing
from collections.abc import Callable, Coroutine
from typing import Any

import fastapi.routing
from fastapi.exceptions import HTTPException, RequestValidationError
from fastapi.params import Depends
from fastapi.routing import APIRoute
from fastapi.security import HTTPBearer
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response

Handler = Callable[[Request], Coroutine[Any, Any, Response]]


class LeanRoute(APIRoute):
    def get_route_handler(self) -> Handler:
        endpoint = self.endpoint
        model, scheme, path_params = _parts(endpoint, self.param_convertors)
        _refuse_other_dependencies(self, scheme)

        async def handle(request: Request) -> Response:
            body = _body(model, await request.body(), request.headers.get("content-type"))
            bearer = await scheme(request)
            params = {name: request.path_params[name] for name in path_params}
            response: Response = await endpoint(**params, body=body, request=request, bearer=bearer)
            return response

        return handle


def _parts(
    endpoint: Callable[..., Any], path: dict[str, Any]
) -> tuple[type[BaseModel], HTTPBearer, list[str]]:
    """The endpoint's body model, bearer scheme and path parameters; TypeError when it takes anything else."""
    if not inspect.iscoroutinefunction(endpoint):
        raise TypeError(f"LeanRoute: {endpoint.__name__} must be `async def`")
    hints = typing.get_type_hints(endpoint, include_extras=True)
    names = list(inspect.signature(endpoint).parameters)
    model, scheme = hints.get("body"), None
    for extra in getattr(hints.get("bearer"), "__metadata__", ()):
        if isinstance(extra, Depends) and isinstance(extra.dependency, HTTPBearer):
            scheme = extra.dependency
    expected = {"body", "request", "bearer", *path}
    if (
        set(names) != expected
        or not (isinstance(model, type) and issubclass(model, BaseModel))
        or hints.get("request") is not Request
        or scheme is None
        or any(hints.get(p) is not str for p in path)
    ):
        raise TypeError(
            f"LeanRoute: {endpoint.__name__} must take its path parameters (str), `body` (a pydantic "
            "model), `request: Request` and `bearer` (Annotated[..., Depends(HTTPBearer(...))]), nothing else"
        )
    return model, scheme, list(path)


def _refuse_other_dependencies(route: APIRoute, scheme: HTTPBearer) -> None:
    """A dependency added around the route (the router's, or an `include_router(dependencies=…)`) would
    never run here: refused when the route is built, and when this FastAPI cannot say which apply (its
    handler is built per inclusion, the inclusion's context in a context variable)."""
    if not hasattr(fastapi.routing, "_effective_route_context_var"):
        raise TypeError("LeanRoute: this FastAPI version hides an inclusion's dependencies; use APIRoute")
    effective = fastapi.routing._effective_route_context_var.get()
    dependant = (
        effective.dependant
        if effective is not None and effective.original_route is route
        else route.dependant
    )
    calls = [d.call for d in dependant.dependencies]
    if calls != [scheme]:
        raise TypeError(
            f"LeanRoute: {route.path} would skip its dependencies {calls}: include it without any"
        )


def _body(model: type[BaseModel], raw: bytes, content_type: str | None) -> BaseModel:
    """`raw` as FastAPI gives a required JSON body model, in one pass of pydantic's JSON parser. Anything
    that pass refuses is refused again FastAPI's way (Python's json, then the model with from_attributes,
    errors located under `body`), so the 422 says what FastAPI's would."""
    if not raw:
        raise RequestValidationError(
            [{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}]
        )
    if _is_json(content_type):
        try:
            return model.model_validate_json(raw)
        except ValidationError:
            pass
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError as exc:
            error = {
                "type": "json_invalid",
                "loc": ("body", exc.pos),
                "msg": "JSON decode error",
                "input": {},
            }
            raise RequestValidationError([error | {"ctx": {"error": exc.msg}}], body=exc.doc) from None
        except ValueError:  # not UTF-8 (nor UTF-16 or -32): FastAPI's 400, which the API answers as 422
            raise HTTPException(400, "There was an error parsing the body") from None
    else:
        value = raw  # FastAPI validates a body not sent as JSON as its bytes
    try:
        return model.model_validate(value, from_attributes=True)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        raise RequestValidationError(errors, body=value) from None


def _is_json(content_type: str | None) -> bool:
    """FastAPI's test: application/json or application/*+json; no Content-Type is not JSON."""
    maintype, _, subtype = (content_type or "").split(";", 1)[0].strip().lower().partition("/")
    return maintype == "application" and (subtype == "json" or subtype.endswith("+json"))
