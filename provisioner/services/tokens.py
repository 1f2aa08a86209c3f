"""Operator bearer tokens: create, list, rotate, revoke, authenticate. Only SHA-256 hashes are stored: a
stolen database grants no access. Tokens are 256-bit random, so a plain hash (no slow KDF) is the right
tool and keeps authentication cheap. A token is shown once, when it is created or rotated.

Revocation and expiry are checked on every request, so they take effect on the next one. The last-use
time is written at most once per LAST_USED_EVERY per token, so a busy CLI does not turn every read into
a write."""

from __future__ import annotations

import hashlib
import re
import secrets
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from contracts.errors import Conflict, InvalidInput, NotFound, RuleViolation, Unauthorized
from provisioner.domain.states import OperatorTokenState
from provisioner.services import audit
from provisioner.services.join_tokens import parse_ttl
from provisioner.store.models import ApiToken

TOKEN_PREFIX = "rbo_"  # rigbase operator token; recognisable in logs and secret scanners
KIND = "operator_token"  # audit kind
ADMIN = "admin"  # the role of every operator token (one role until roles are needed)
LAST_USED_EVERY = timedelta(seconds=60)
_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _now() -> datetime:
    return datetime.now(UTC)


def _new_secret() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def bootstrap_admin(session: Session) -> str | None:
    """Create the first admin token when none exists; return it (the only time it is visible)."""
    if session.scalar(select(func.count()).select_from(ApiToken)):
        return None
    token = _new_secret()
    session.add(ApiToken(name="admin", role=ADMIN, token_sha256=_digest(token)))
    session.flush()
    return token


def state_of(row: ApiToken, now: datetime | None = None) -> OperatorTokenState:
    if row.revoked_at is not None:
        return OperatorTokenState.REVOKED
    if row.expires_at is not None and row.expires_at <= (now or _now()):
        return OperatorTokenState.EXPIRED
    return OperatorTokenState.LIVE


def is_live(row: ApiToken, now: datetime | None = None) -> bool:
    return state_of(row, now) is OperatorTokenState.LIVE


def authenticate(session: Session, token: str | None) -> ApiToken:
    """The token's row, or Unauthorized; the actor in the audit trail is `operator:<name>`."""
    if not token:
        raise Unauthorized(
            "no bearer token: set RIGBASE_TOKEN or use the client config written by `provision serve`",
            code="token_missing",
        )
    row = session.scalar(select(ApiToken).where(ApiToken.token_sha256 == _digest(token)))
    if row is None:
        raise Unauthorized(
            "the bearer token is not valid: use the token in the client config written by `provision serve`",
            code="token_invalid",
        )
    now = _now()
    state = state_of(row, now)
    if state is OperatorTokenState.REVOKED:
        raise Unauthorized(
            f"operator token '{row.name}' was revoked: ask an administrator for a new one "
            "(`provision token create`)",
            code="token_revoked",
        )
    if state is OperatorTokenState.EXPIRED:
        assert row.expires_at is not None
        raise Unauthorized(
            f"operator token '{row.name}' expired at {row.expires_at:%Y-%m-%d %H:%M} UTC: "
            f"rotate it (`provision token rotate {row.name}`) with another token",
            code="token_expired",
        )
    if row.last_used_at is None or now - row.last_used_at >= LAST_USED_EVERY:
        row.last_used_at = now
    return row


def is_valid(session: Session, token: str) -> bool:
    row = session.scalar(select(ApiToken).where(ApiToken.token_sha256 == _digest(token)))
    return row is not None and is_live(row)


def list_all(session: Session) -> list[ApiToken]:
    return list(session.scalars(select(ApiToken).order_by(ApiToken.created_at, ApiToken.name)))


def get(session: Session, ref: str) -> ApiToken:
    row = session.scalar(select(ApiToken).where((ApiToken.name == ref) | (ApiToken.id == ref)))
    if row is None:
        raise NotFound(f"no operator token '{ref}': see `provision token list`")
    return row


def _expiry(ttl: str | None) -> datetime | None:
    delta = parse_ttl(ttl) if ttl else None
    return _now() + delta if delta else None


def create(session: Session, name: str, *, ttl: str | None = None, actor: str) -> tuple[ApiToken, str]:
    """A new token named `name` (unique, kept after revocation for the audit trail); returns it once."""
    if not _NAME.fullmatch(name):
        raise InvalidInput(
            f"token name {name[:80]!r} is not valid: use 1-63 lowercase letters, digits and '-', "
            "starting with a letter or digit"
        )
    if session.scalar(select(ApiToken.id).where(ApiToken.name == name)):
        raise Conflict(f"an operator token named '{name}' exists: pick another name or rotate it")
    token = _new_secret()
    row = ApiToken(name=name, role=ADMIN, token_sha256=_digest(token), expires_at=_expiry(ttl))
    session.add(row)
    session.flush()
    audit.note(
        session,
        kind=KIND,
        resource_id=row.id,
        name=name,
        actor=actor,
        state=OperatorTokenState.LIVE.value,
        reason="created",
    )
    return row, token


def rotate(session: Session, ref: str, *, ttl: str | None = None, actor: str) -> tuple[ApiToken, str]:
    """A new secret for the token `ref`; the old one stops working at once. Keeps the expiry unless
    `ttl` gives a new one."""
    row = get(session, ref)
    if row.revoked_at is not None:
        raise RuleViolation(f"operator token '{row.name}' is revoked: create a new one instead")
    token = _new_secret()
    row.token_sha256 = _digest(token)
    if ttl:
        row.expires_at = _expiry(ttl)
    audit.note(
        session,
        kind=KIND,
        resource_id=row.id,
        name=row.name,
        actor=actor,
        state=OperatorTokenState.LIVE.value,
        reason="rotated",
    )
    return row, token


def revoke(session: Session, ref: str, *, actor: str, current: str | None = None) -> ApiToken:
    """Revoke `ref` for good. The last live token cannot be revoked: nobody could operate afterwards."""
    row = get(session, ref)
    if row.revoked_at is not None:
        return row
    live = [t for t in list_all(session) if is_live(t) and t.id != row.id]
    if not live:
        raise RuleViolation(
            f"'{row.name}' is the last live operator token: create another (`provision token create`) first"
        )
    row.revoked_at = _now()
    reason = "revoked" + (" (its own request)" if current == f"operator:{row.name}" else "")
    audit.note(
        session,
        kind=KIND,
        resource_id=row.id,
        name=row.name,
        actor=actor,
        state=OperatorTokenState.REVOKED.value,
        reason=reason,
    )
    return row
