"""What a console request brings: the posted form (application/x-www-form-urlencoded, parsed here so the
console needs no multipart library), who is signed in, and the CSRF check every post passes first.

A page or action that needs a signed-in operator takes `SignedIn`; a post takes `Posted`, which is
SignedIn plus a form whose CSRF token matched. The refusals are exceptions the console turns into pages
(provisioner/api/console/__init__.py): SignInRequired redirects to the sign-in page, CsrfRefused is a 403
with one line."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated
from urllib.parse import parse_qs

from fastapi import Depends, Request
from sqlalchemy import delete
from sqlalchemy.orm import Session

from contracts.errors import InvalidInput, Unavailable
from contracts.jobs import INT64_END
from provisioner.api.console.session import SESSION_COOKIE, SESSION_MAX_AGE_S, SessionValue, Signer
from provisioner.domain.roles import Principal, refuse_scrape_token
from provisioner.domain.text import printable
from provisioner.services.accounts import tokens
from provisioner.store.account_models import Account, ConsoleSessionEnd
from provisioner.store.models import ApiToken

CSRF_FIELD = "csrf"
CSRF_REFUSAL = "the form carries no valid CSRF token: reload the page and submit it again"


class SignInRequired(Exception):
    """No session, or one that ended: the message (None for a plain first visit) is shown at sign-in."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or "sign in")
        self.message = message


class CsrfRefused(Exception):
    pass


@dataclass(frozen=True)
class Form:
    """The posted fields; every value a stripped string ("" when absent)."""

    fields: dict[str, list[str]]

    def get(self, name: str) -> str:
        return (self.fields.get(name) or [""])[0].strip()

    def optional(self, name: str) -> str | None:
        return self.get(name) or None

    def required(self, name: str, label: str | None = None) -> str:
        value = self.get(name)
        if not value:
            raise InvalidInput(f"{label or name} is empty: fill it in and submit again")
        return value

    def flag(self, name: str) -> bool:
        """A checkbox: sent ("on") when ticked, absent when not."""
        return bool(self.get(name))

    def number(self, name: str, label: str) -> int:
        return whole_number(self.required(name, label), label)


def whole_number(value: str, label: str, *, end: int = INT64_END) -> int:
    """A number typed into a form or sent in a console query: ASCII digits, below `end` (by default what
    the store's 64-bit integers hold). `str.isdigit` alone also passes '²', which int() refuses, and a
    number past the store's integers fails in its driver: either was a 500."""
    if not (value.isascii() and value.isdigit()) or len(value) > len(str(end)) or int(value) >= end:
        raise InvalidInput(
            f"{label} '{printable(value, 40)}' is not a whole number: enter one from 0 to {end - 1}"
        )
    return int(value)


async def _form(request: Request) -> Form:
    body = await request.body()  # bounded before it gets here (provisioner/api/limits.py)
    return Form(parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True))


def signer_of(request: Request) -> Signer:
    signer: Signer = request.app.state.console_signer
    return signer


def principal_of_row(session: Session, row: ApiToken) -> Principal:
    """The Principal of a live token's row: what services/accounts.principal_of gives for its token."""
    account = session.get(Account, row.account_id)
    if account is None:
        raise Unavailable(f"operator token '{row.name}' names no account: the store is inconsistent")
    refuse_scrape_token(row.role)
    return Principal(actor=f"operator:{row.name}", account_id=account.id, role=row.role, root=account.root)


@dataclass(frozen=True)
class Who:
    """The signed-in operator: the Principal the API would see for their token, and this session."""

    principal: Principal
    session: SessionValue
    token_name: str
    csrf: str


def end_session(session: Session, value: SessionValue) -> None:
    """Sign out: the session is refused from now on, by every process, after a restart too."""
    now = datetime.now(UTC)
    session.execute(delete(ConsoleSessionEnd).where(ConsoleSessionEnd.until < now))
    until = datetime.fromtimestamp(value.issued_at + SESSION_MAX_AGE_S, UTC)
    if session.get(ConsoleSessionEnd, value.sid) is None:
        session.add(ConsoleSessionEnd(sid=value.sid, until=until))


def _signed_in(request: Request) -> Who:
    signer = signer_of(request)
    value = signer.session(request.cookies.get(SESSION_COOKIE))
    if value is None:
        raise SignInRequired(
            "your session ended: sign in again" if SESSION_COOKIE in request.cookies else None
        )
    session: Session = request.app.state.sessions()
    try:
        if session.get(ConsoleSessionEnd, value.sid) is not None:  # signed out, in any process
            raise SignInRequired("your session ended: sign in again")
        row = session.get(ApiToken, value.token_id)
        if row is None or not row.token_sha256.startswith(value.fingerprint):
            raise SignInRequired("the token of your session was rotated or deleted: sign in with the new one")
        if not tokens.is_live(row):
            state = tokens.state_of(row).value
            raise SignInRequired(f"operator token '{row.name}' is {state}: sign in with a live token")
        now = datetime.now(UTC)
        if row.last_used_at is None or now - row.last_used_at >= tokens.LAST_USED_EVERY:
            row.last_used_at = now  # as an API call with the token does (`provision token list`)
        who = Who(principal_of_row(session, row), value, row.name, signer.csrf_for(value.sid))
        session.commit()
    finally:
        session.close()
    request.state.actor = who.principal.actor
    return who


SignedIn = Annotated[Who, Depends(_signed_in)]


def _posted(request: Request, who: SignedIn, form: Annotated[Form, Depends(_form)]) -> tuple[Who, Form]:
    if not signer_of(request).csrf_ok(who.session.sid, form.get(CSRF_FIELD)):
        raise CsrfRefused(CSRF_REFUSAL)
    return who, form


Posted = Annotated[tuple[Who, Form], Depends(_posted)]
RawForm = Annotated[Form, Depends(_form)]
