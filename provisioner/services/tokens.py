"""Operator bearer tokens. Only SHA-256 hashes are stored: a stolen database grants no access.
Tokens are 256-bit random, so a plain hash (no slow KDF) is the right tool and keeps auth cheap."""

from __future__ import annotations

import hashlib
import secrets

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from contracts.errors import Unauthorized
from provisioner.store.models import ApiToken

TOKEN_PREFIX = "rbo_"  # rigbase operator token; recognisable in logs and secret scanners


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def bootstrap_admin(session: Session) -> str | None:
    """Create the first admin token when none exists; return it (the only time it is visible)."""
    if session.scalar(select(func.count()).select_from(ApiToken)):
        return None
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    session.add(ApiToken(name="admin", role="admin", token_sha256=_digest(token)))
    session.flush()
    return token


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
    return row


def is_valid(session: Session, token: str) -> bool:
    return session.scalar(select(ApiToken.id).where(ApiToken.token_sha256 == _digest(token))) is not None
