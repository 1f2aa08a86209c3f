"""Every error leaves the API as JSON {"code", "message"} with one human line in `message`."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException

from contracts.errors import (
    Conflict,
    Forbidden,
    InvalidInput,
    NotFound,
    RigbaseError,
    RuleViolation,
    Unauthorized,
    Unavailable,
)
from provisioner.domain.text import printable

log = logging.getLogger("rigbase.api")

# The HTTP status of each refusal class (the classes themselves know nothing of HTTP: contracts/errors.py).
# Looked up along the class's MRO, so a subclass answers with its base's status.
HTTP_STATUS: dict[type[RigbaseError], int] = {
    InvalidInput: 422,
    NotFound: 404,
    Conflict: 409,
    RuleViolation: 409,
    Unauthorized: 401,
    Forbidden: 403,
    Unavailable: 503,
    RigbaseError: 400,
}


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
        said = printable(f"{where or 'request'}: {first['msg']}")
        return _json(422, "invalid_input", f"{said}{more}: fix it and retry")

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
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
