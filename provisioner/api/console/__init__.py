"""The operator's console: server-rendered pages at `/`, beside the API at /v1 (docs/console.md).

Jinja2 templates, one stylesheet and one small script (live logs and grids; every page works without
it), no build step. Sign-in takes an operator token
(the one `provision token create` prints); the session cookie is signed, HttpOnly, SameSite=Strict and
Secure over TLS (session.py). Every form carries a CSRF token (forms.py). Pages read, and buttons act,
through the services the API routes call, as the signed-in token's principal, in units of work scoped
to its account as the API's fleet routes are (store/row_scope.py). None of these routes is in the
OpenAPI document.

`mount(app)` adds the console to the control plane's app (provisioner/api/app.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response
from starlette.convertors import Convertor, register_url_convertor

from provisioner.api.console import actions, billing_pages, data_pages, job_pages, pages
from provisioner.api.console.render import HERE, not_found
from provisioner.api.console.session import Signer, signing_key
from provisioner.api.deps import unit_of_work_slot

STYLESHEET: Final = (HERE / "static" / "console.css").read_bytes()
SCRIPT: Final = (HERE / "static" / "console.js").read_bytes()
# the charting library, as its package publishes it (static/vendor/uplot/README.md)
CHARTS: Final = {
    "/static/vendor/uplot.js": (
        (HERE / "static/vendor/uplot/uPlot.iife.min.js").read_bytes(),
        "text/javascript",
    ),
    "/static/vendor/uplot.css": ((HERE / "static/vendor/uplot/uPlot.min.css").read_bytes(), "text/css"),
}


class ConsolePage(Convertor[str]):
    """Any path but the API's own (/v1/..., /openapi.json, /healthz): so the console's "no such page"
    never shadows an API answer, not even a 405 for a known API path and another method."""

    regex = r"(?!v1/|v1$|openapi\.json$|healthz$).*"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("console_page", ConsolePage())


def _stylesheet() -> Response:
    return Response(STYLESHEET, media_type="text/css", headers={"Cache-Control": "max-age=3600"})


def _script() -> Response:
    return Response(SCRIPT, media_type="text/javascript", headers={"Cache-Control": "max-age=3600"})


def _static(body: bytes, media_type: str) -> Callable[[], Response]:
    def serve() -> Response:
        return Response(body, media_type=media_type, headers={"Cache-Control": "max-age=86400"})

    return serve


def mount(app: FastAPI) -> None:
    """The console's routes, after the API's: unknown console paths get the console's 404 page."""
    app.state.console_signer = Signer(signing_key(app.state.runtime.sealer))
    # Console handlers open their own sessions: the same admission as the API's units of work
    # (provisioner/api/admission.py), so a page or a form cannot stall behind a join burst holding a thread
    admitted = [Depends(unit_of_work_slot)]
    for router in (pages.router, job_pages.router, billing_pages.router, data_pages.router, actions.router):
        app.include_router(router, dependencies=admitted)
    app.add_api_route("/static/console.css", _stylesheet, methods=["GET"], include_in_schema=False)
    app.add_api_route("/static/console.js", _script, methods=["GET"], include_in_schema=False)
    for path, (body, media_type) in CHARTS.items():
        app.add_api_route(path, _static(body, media_type), methods=["GET"], include_in_schema=False)

    def page_not_found(request: Request, path: str) -> Response:
        return not_found(request)

    app.add_api_route("/{path:console_page}", page_not_found, methods=["GET"], include_in_schema=False)


__all__ = ["mount"]
