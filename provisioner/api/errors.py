"""Every error leaves the API as JSON {"code", "message"} (schemas.ErrorOut) with one human line in
`message`; the OpenAPI document says so for every status a route can answer with (`documented`,
`describe_errors`), in place of FastAPI's own 422 shape, which this server never sends."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException

from contracts.errors import (
    Conflict,
    Forbidden,
    Gone,
    InvalidInput,
    NotFound,
    RigbaseError,
    RuleViolation,
    Unauthorized,
    Unavailable,
    plain_validation_message,
)
from provisioner.api.deps import OPERATOR_TOKEN
from provisioner.api.schemas import ErrorOut
from provisioner.domain.text import printable

log = logging.getLogger("rigbase.api")

# The HTTP status of each refusal class (the classes themselves know nothing of HTTP: contracts/errors.py).
# Looked up along the class's MRO, so a subclass answers with its base's status.
HTTP_STATUS: dict[type[RigbaseError], int] = {
    InvalidInput: 422,
    NotFound: 404,
    Conflict: 409,
    Gone: 410,
    RuleViolation: 409,
    Unauthorized: 401,
    Forbidden: 403,
    Unavailable: 503,
    RigbaseError: 400,
}


# What each refusal status means to a client, for the OpenAPI document; the body is always ErrorOut.
MEANING: dict[int, str] = {
    401: "no bearer token, or not a valid one for this route",
    403: "refused: the message says which check failed",
    404: "no such resource (or API route)",
    409: "conflicts with the current state: already exists, still in use, or not allowed in this state",
    410: "it has ended: the message gives its state",
    413: "the body is larger than this route accepts",
    422: "invalid input: the message names the first invalid field",
    429: "too many failed authentications or join attempts from this address lately: see Retry-After",
    503: "the database is unreachable: retry later",
}


def documented(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` for a router or route: these statuses, each with the ErrorOut body."""
    return {status: {"model": ErrorOut, "description": MEANING[status]} for status in statuses}


# The refusals of each kind of route, whatever its shape (given to routers and routes as `responses=`).
OPERATOR_ERRORS = documented(401, 429, 503)
JOIN_ERRORS = documented(403, 409, 429, 503)  # the join token is in the body: a bad one is a 403
PROOF_ERRORS = documented(401, 403, 409, 429, 503)
NODE_ERRORS = documented(401, 403, 429, 503)

Operation = dict[str, Any]


# query parameters that name a resource (a list filtered by region answers 404 for an unknown region)
NAMING_QUERY = frozenset({"region", "provider", "node"})


def _names_a_resource(method: str, op: Operation) -> bool:
    """A path or query parameter names one, or an operator's write whose body names its region or
    provider (a node added to a region that does not exist)."""
    if _has_body(method, op) and _is_operator_write(method, op):
        return True
    return any(
        p.get("in") == "path" or (p.get("in") == "query" and p.get("name") in NAMING_QUERY)
        for p in op.get("parameters", [])
    )


def _has_body(_: str, op: Operation) -> bool:
    return "requestBody" in op


def _has_input(method: str, op: Operation) -> bool:
    return _has_body(method, op) or bool(op.get("parameters"))


def _is_operator_write(method: str, op: Operation) -> bool:
    return method in ("post", "put", "patch", "delete") and {OPERATOR_TOKEN.scheme_name: []} in op.get(
        "security", []
    )


# The refusals that follow from an operation's shape, added to every operation of that shape: a path
# names a resource that may not exist, a body may be too large, input may be invalid, and an operator's
# write may conflict with what is there.
SHAPE_ERRORS: tuple[tuple[Callable[[str, Operation], bool], tuple[int, ...]], ...] = (
    (_names_a_resource, (404,)),
    (_has_body, (413,)),
    (_has_input, (422,)),
    (_is_operator_write, (409,)),
)
_ERROR_REF = {"$ref": "#/components/schemas/ErrorOut"}


def describe_errors(schema: dict[str, Any]) -> dict[str, Any]:
    """The generated OpenAPI document with SHAPE_ERRORS added to each operation, and every 422 in the
    shape the server sends (ErrorOut) instead of FastAPI's HTTPValidationError."""
    for item in schema.get("paths", {}).values():
        for method, op in item.items():
            responses = op.setdefault("responses", {})
            responses.pop("422", None)
            for applies, statuses in SHAPE_ERRORS:
                for status in statuses if applies(method, op) else ():
                    responses.setdefault(
                        str(status),
                        {
                            "description": MEANING[status],
                            "content": {"application/json": {"schema": _ERROR_REF}},
                        },
                    )
    models = schema.setdefault("components", {}).setdefault("schemas", {})
    models.setdefault("ErrorOut", ErrorOut.model_json_schema())
    for unused in ("HTTPValidationError", "ValidationError"):
        models.pop(unused, None)
    return schema


def http_status(exc: RigbaseError) -> int:
    return next(HTTP_STATUS[cls] for cls in type(exc).__mro__ if cls in HTTP_STATUS)


def _json(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"code": code, "message": message}, status_code=status, headers=headers)


def install(app: FastAPI) -> None:
    @app.exception_handler(RigbaseError)
    async def rigbase_error(_: Request, exc: RigbaseError) -> JSONResponse:
        status = http_status(exc)
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        return _json(status, exc.code, exc.message, headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        where = ".".join(str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path"))
        more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
        # the field path and message quote the client's keys and values: one bounded line
        said = printable(f"{where or 'request'}: {plain_validation_message(str(first['msg']))}")
        return _json(422, "invalid_input", f"{said}{more}: fix it and retry")

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        if exc.status_code == 400:  # FastAPI's "error parsing the body": invalid input like any other
            return _json(422, "invalid_input", "the request body is not valid JSON: send a JSON object")
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        message = "no such API route: see /openapi.json" if exc.status_code == 404 else str(exc.detail)
        return _json(exc.status_code, code, message)

    @app.exception_handler(OperationalError)
    async def database_down(_: Request, exc: OperationalError) -> JSONResponse:
        log.error("database error: %s", exc)
        return _json(503, "unavailable", "the database is unreachable: check it is running, then retry")

    @app.exception_handler(Exception)
    async def internal(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return _json(500, "internal", f"internal error ({type(exc).__name__}): see the server log")
