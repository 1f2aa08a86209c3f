"""Operator bearer tokens: create, list, rotate, revoke, authenticate. Only SHA-256 hashes are stored: a
stolen database grants no access. Tokens are 256-bit random, so a plain hash (no slow KDF) is the right
tool and keeps authentication cheap. A token is shown once, when it is created or rotated.

Revocation and expiry are checked on every request, so they take effect on the next one. The last-use
time is written at most once per LAST_USED_EVERY per token, so a busy CLI does not turn every read into
a write.

Every token belongs to an account and has a role in it (domain/roles.py, docs/accounts.md); the first
admin token, made at first start, belongs to the root account. Reads and changes are scoped: `scope` is
the account id whose tokens the caller sees, None for all (the root account's admins)."""

from __future__ import annotations

import hashlib
import re
import secrets
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from contracts.errors import Conflict, InvalidInput, NotFound, RuleViolation, Unauthorized
from provisioner.domain.roles import Role
from provisioner.domain.states import OperatorTokenState
from provisioner.services.common import audit
from provisioner.services.common.account_lookup import root_account
from provisioner.services.fleet.join_tokens import parse_ttl
from provisioner.store.models import ApiToken

TOKEN_PREFIX = "rbo_"  # rigbase operator token; recognisable in logs and secret scanners
KIND = "operator_token"  # audit kind
ADMIN = Role.ADMIN.value  # the role of the first token
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
    session.add(
        ApiToken(name="admin", role=ADMIN, account_id=root_account(session).id, token_sha256=_digest(token))
    )
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


def list_all(session: Session, scope: str | None = None) -> list[ApiToken]:
    stmt = select(ApiToken).order_by(ApiToken.created_at, ApiToken.name)
    if scope is not None:
        stmt = stmt.where(ApiToken.account_id == scope)
    return list(session.scalars(stmt))


def get(session: Session, ref: str, scope: str | None = None) -> ApiToken:
    """By name or id; another account's token (outside `scope`) is as missing as an unknown one."""
    row = session.scalar(select(ApiToken).where((ApiToken.name == ref) | (ApiToken.id == ref)))
    if row is None or (scope is not None and row.account_id != scope):
        raise NotFound(f"no operator token '{ref}': see `provision token list`")
    return row


def _expiry(ttl: str | None) -> datetime | None:
    delta = parse_ttl(ttl) if ttl else None
    return _now() + delta if delta else None


def create(
    session: Session,
    name: str,
    *,
    ttl: str | None = None,
    actor: str,
    account_id: str | None = None,
    role: str = ADMIN,
) -> tuple[ApiToken, str]:
    """A new token named `name` (unique, kept after revocation for the audit trail) in `account_id` (None:
    the root account) with `role`; returns it once. Who may create it: services/accounts.token_account."""
    if role not in set(Role):
        raise InvalidInput(f"role {role[:20]!r} is not known: use {' or '.join(Role)}")
    if role == Role.SCRAPE and account_id is not None and account_id != root_account(session).id:
        raise InvalidInput("a scrape token reads the whole fleet's /metrics: create it in the root account")
    if not _NAME.fullmatch(name):
        raise InvalidInput(
            f"token name {name[:80]!r} is not valid: use 1-63 lowercase letters, digits and '-', "
            "starting with a letter or digit"
        )
    if session.scalar(select(ApiToken.id).where(ApiToken.name == name)):
        raise Conflict(f"an operator token named '{name}' exists: pick another name or rotate it")
    token = _new_secret()
    row = ApiToken(
        name=name,
        role=role,
        account_id=account_id or root_account(session).id,
        token_sha256=_digest(token),
        expires_at=_expiry(ttl),
    )
    session.add(row)
    session.flush()
    audit.note(
        session,
        kind=KIND,
        resource_id=row.id,
        name=name,
        actor=actor,
        state=OperatorTokenState.LIVE.value,
        reason=f"created ({role})",
    )
    return row, token


def rotate(
    session: Session, ref: str, *, ttl: str | None = None, actor: str, scope: str | None = None
) -> tuple[ApiToken, str]:
    """A new secret for the token `ref`; the old one stops working at once. Keeps the expiry unless
    `ttl` gives a new one."""
    row = get(session, ref, scope)
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


def revoke(
    session: Session, ref: str, *, actor: str, current: str | None = None, scope: str | None = None
) -> ApiToken:
    """Revoke `ref` for good. The last live admin token of the root account cannot be revoked: nobody
    could administer the fleet afterwards."""
    row = get(session, ref, scope)
    if row.revoked_at is not None:
        return row
    root = root_account(session).id
    fleet_admins = [t for t in list_all(session, root) if t.role == ADMIN and is_live(t)]
    if [t.id for t in fleet_admins] == [row.id]:
        raise RuleViolation(
            f"'{row.name}' is the last live operator token of an admin of the root account: create another "
            "(`provision token create NAME --role admin`) first"
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
