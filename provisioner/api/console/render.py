"""Pages out: Jinja2 templates (provisioner/api/console/templates), the headers every console answer
carries, one-shot messages after a post (Post/Redirect/Get), and the unit of work an action runs in."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.routing import APIRoute
from fastapi.templating import Jinja2Templates
from sqlalchemy.orm import Session
from starlette.exceptions import HTTPException

from contracts.errors import RigbaseError
from provisioner.api.console.forms import CSRF_FIELD, CsrfRefused, SignInRequired, Who, signer_of
from provisioner.api.console.session import FLASH_COOKIE, SESSION_COOKIE
from provisioner.api.deps import enter_fleet
from provisioner.api.errors import http_status
from provisioner.domain.roles import Principal
from provisioner.domain.states import JobState
from provisioner.providers.base import Feature, provider_for

HERE: Final = Path(__file__).parent
TEMPLATES: Final = Jinja2Templates(directory=str(HERE / "templates"))

# Scripts from this origin only (static/console.js: live logs and grids; no inline script, no eval), no
# frame, no foreign form target or fetch: these make clickjacking and injected markup harmless. Every
# page works without the script.
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; connect-src 'self'; "
    "style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def _when(value: datetime | None) -> str:
    """Times as UTC to the second, the way the CLI's wide output shows them."""
    if value is None:
        return "-"
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


TEMPLATES.env.filters["when"] = _when


def _duration(seconds: float | None) -> str:
    """A run time to the second: `1h 02m 05s`; `-` for a job that never started."""
    if seconds is None:
        return "-"
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"


TEMPLATES.env.filters["duration"] = _duration
TEMPLATES.env.globals["job_states"] = JobState


def _has_quota(kind: str) -> bool:
    """Whether regions of this provider kind have a quota page (the driver says, not its name)."""
    return provider_for(kind).supports(Feature.QUOTA)


TEMPLATES.env.tests["with_quota"] = _has_quota


def secure(request: Request) -> bool:
    """Cookies are Secure when the console is served over TLS (as `provision serve` does by default)."""
    return request.url.scheme == "https"


def set_cookie(response: Response, request: Request, name: str, value: str, max_age: int | None) -> None:
    response.set_cookie(
        name, value, max_age=max_age, path="/", httponly=True, secure=secure(request), samesite="strict"
    )


def clear_cookie(response: Response, request: Request, name: str) -> None:
    response.delete_cookie(name, path="/", httponly=True, secure=secure(request), samesite="strict")


def page(request: Request, template: str, who: Who | None, status: int = 200, **context: Any) -> HTMLResponse:
    flash = signer_of(request).read_flash(request.cookies.get(FLASH_COOKIE))
    response = TEMPLATES.TemplateResponse(
        request,
        template,
        {"who": who, "csrf_field": CSRF_FIELD, "csrf": who.csrf if who else "", "flash": flash, **context},
        status_code=status,
        headers=SECURITY_HEADERS,
    )
    if FLASH_COOKIE in request.cookies:
        clear_cookie(response, request, FLASH_COOKIE)
    return response


def error_page(request: Request, who: Who | None, status: int, message: str) -> HTMLResponse:
    return page(request, "error.html", who, status=status, message=message, status_code=status)


def redirect(request: Request, to: str, kind: str | None = None, message: str | None = None) -> Response:
    response = RedirectResponse(to, status_code=303, headers=SECURITY_HEADERS)
    if kind and message:
        set_cookie(response, request, FLASH_COOKIE, signer_of(request).flash(kind, message), 300)
    return response


def local_path(candidate: str, fallback: str = "/") -> str:
    """A redirect target from a form: only a path on this console (never another site)."""
    if candidate.startswith("/") and not candidate.startswith("//") and "\\" not in candidate:
        return candidate
    return fallback


@contextmanager
def reading(request: Request, *, fleet: Principal | None = None) -> Iterator[Session]:
    """A unit of work for a page: nothing it does is kept. `fleet`: the page shows the fleet as this
    principal sees it (api/deps.enter_fleet: its account's regions only, every region for a root admin),
    so another account's region or anything in it is missing, as in the API."""
    session: Session = request.app.state.sessions()
    try:
        if fleet is not None:
            enter_fleet(session, fleet, changes=False)
        yield session
    finally:
        session.rollback()
        session.close()


@dataclass(frozen=True)
class Done:
    """What an action did (one line) and the page to show next (None: the page the form was on)."""

    message: str
    to: str | None = None


def perform(
    request: Request, back: str, work: Callable[[Session], Done], *, fleet: Principal | None = None
) -> Response:
    """Run one action in its own unit of work. Success commits and shows the next page with the line
    saying what was done; a refusal rolls everything back and shows the page the form was on with the
    API's own one-line message (no partial state, as in the API). `fleet`: the action changes the fleet
    as this principal, as the API's fleet routes do (api/deps.enter_fleet: scoped, admins only)."""
    session: Session = request.app.state.sessions()
    try:
        if fleet is not None:
            enter_fleet(session, fleet, changes=True)
        done = work(session)
        session.commit()
    except RigbaseError as exc:
        session.rollback()
        return redirect(request, back, "error", exc.message)
    finally:
        session.close()
    return redirect(request, done.to or back, "ok", done.message)


class ConsoleRoute(APIRoute):
    """A console route answers in HTML whatever happens: the API's refusals (a missing or hidden
    resource, a bad value in a page's query) become an error page with the API's one line and status;
    no session redirects to sign-in; a post without its CSRF token is a 403 page."""

    def get_route_handler(self) -> Callable[[Request], Any]:
        handler = super().get_route_handler()

        async def console_handler(request: Request) -> Response:
            try:
                response: Response = await handler(request)
                return response
            except SignInRequired as exc:
                back = request.url.path if request.method == "GET" else "/"
                to = "/signin" if back in ("/", "/signin") else f"/signin?next={quote(back)}"
                response = redirect(request, to, "error" if exc.message else None, exc.message)
                if exc.message:  # the session is over: do not keep sending it
                    clear_cookie(response, request, SESSION_COOKIE)
                return response
            except CsrfRefused as exc:
                return error_page(request, None, 403, str(exc))
            except RigbaseError as exc:
                return error_page(request, None, http_status(exc), exc.message)

        return console_handler


def not_found(request: Request) -> Response:
    """The console's answer to a page it does not have, for a browser (it asks for text/html). Any other
    client gets the API's own JSON 404, as before the console existed."""
    if request.url.path.startswith("/v1/") or "text/html" not in request.headers.get("accept", ""):
        raise HTTPException(404)
    return error_page(request, None, 404, f"no such page: {request.url.path}: start from the Resources page")


__all__ = ["SESSION_COOKIE", "TEMPLATES", "page", "redirect", "perform", "reading", "Done", "ConsoleRoute"]
