"""Region join tokens: issue (shown once, stored as SHA-256), revoke, and resolve a presented token to
its region. A token is 256-bit random, so a plain hash is the right tool (no slow KDF needed). A token
issued for an enrollment bundle is also kept sealed (adapters/secrets.py), so the region's next bundle
carries the same live token instead of adding one more."""

from __future__ import annotations

import hashlib
import re
import secrets
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from contracts.bundle import EnrollmentBundle
from contracts.errors import InvalidInput, NotFound
from provisioner.attestation.refusals import Refusal, RefusalCode, refuse
from provisioner.domain.states import (
    JOIN_TOKEN_TRANSITIONS,
    REGION_LEAVING,
    JoinTokenState,
    join_token_state,
)
from provisioner.services.common import lifecycle
from provisioner.services.common.runtime import runtime_of
from provisioner.services.regions import regions as region_service
from provisioner.store.join_models import JoinToken
from provisioner.store.models import Region

TOKEN_PREFIX = "rbj_"  # rigbase join token; recognisable in logs and secret scanners
DEFAULT_TTL = "7d"
KIND = "join_token"  # audit kind
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_TTL = re.compile(r"(\d{1,12})([smhdw])")  # fullmatch: `re.match` with `$` lets "7d\n" through
# a bundle reuses the region's live bundle token only while it enrols for at least this much longer
REUSE_AT_LEAST = timedelta(days=1)
MAX_TTL = timedelta(days=365)  # longer is 'never'; also keeps expiry dates far from datetime's limits


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def parse_ttl(text: str) -> timedelta | None:
    """'30m', '24h', '7d', '2w', '3600s'; 'never' for a token that does not expire."""
    if text == "never":
        return None
    m = _TTL.fullmatch(text)
    if not m or int(m.group(1)) == 0:
        raise InvalidInput(
            f"TTL {text!r} is not valid: use a number with s, m, h, d or w (e.g. 24h, 7d) or 'never'",
            code="invalid_ttl",
        )
    seconds = int(m.group(1)) * _UNITS[m.group(2)]
    if seconds > MAX_TTL.total_seconds():
        raise InvalidInput(
            f"TTL {text!r} is longer than the maximum of {MAX_TTL.days}d: use at most {MAX_TTL.days}d "
            "or 'never'",
            code="invalid_ttl",
        )
    return timedelta(seconds=seconds)


def issue(
    session: Session, region: str, *, ttl: str = DEFAULT_TTL, actor: str, keep: bool = False
) -> tuple[JoinToken, str]:
    """A new token for `region`; returns the row and the token (the only time it is visible, unless
    `keep`: a bundle's token is also kept sealed, so the next bundle of the region can carry it again)."""
    lifetime = parse_ttl(ttl)
    reg = region_service.get(session, region)
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    now = datetime.now(UTC)
    row = JoinToken(
        region_id=reg.id,
        token_sha256=digest(token),
        created_by=actor,
        created_at=now,
        expires_at=now + lifetime if lifetime else None,
        sealed_token=runtime_of(session).sealer.seal(token.encode()) if keep else None,
    )
    session.add(row)
    session.flush()
    expires = row.expires_at.isoformat() if row.expires_at else "never"
    lifecycle.record(
        session,
        kind=KIND,
        resource_id=row.id,
        name=reg.name,
        actor=actor,
        table=JOIN_TOKEN_TRANSITIONS,
        frm=None,
        to=JoinTokenState.ISSUED,
        reason=f"expires {expires}",
    )
    return row, token


def for_bundle(
    session: Session, region: str, *, ttl: str | None, actor: str, now: datetime | None = None
) -> tuple[JoinToken, str, bool]:
    """The join token a region's bundle carries, and whether it was reused: with no `ttl`, the newest
    live token an earlier bundle of the region carried, unless it stops enrolling within REUSE_AT_LEAST
    (media made now would soon be refused); else, or with a `ttl`, a new one (DEFAULT_TTL if none)."""
    if ttl is None:
        reg = region_service.get(session, region)
        now = now or datetime.now(UTC)
        live = session.scalars(
            select(JoinToken)
            .where(
                JoinToken.region_id == reg.id,
                JoinToken.revoked_at.is_(None),
                JoinToken.sealed_token.is_not(None),
                or_(JoinToken.expires_at.is_(None), JoinToken.expires_at > now + REUSE_AT_LEAST),
            )
            .order_by(JoinToken.created_at.desc(), JoinToken.id.desc())
            .limit(1)
        ).first()
        if live is not None and live.sealed_token is not None:
            return live, runtime_of(session).sealer.unseal(live.sealed_token).decode(), True
    row, token = issue(session, region, ttl=ttl or DEFAULT_TTL, actor=actor, keep=True)
    return row, token, False


def revoke(session: Session, region: str, *, actor: str) -> int:
    """Revoke every live token of `region`; minions holding one are refused from now on."""
    reg = region_service.get(session, region)
    now = datetime.now(UTC)
    rows = list(
        session.scalars(
            select(JoinToken).where(JoinToken.region_id == reg.id, JoinToken.revoked_at.is_(None))
        )
    )
    was = {row.id: join_token_state(None, row.expires_at, now) for row in rows}  # issued or expired
    if rows:
        session.execute(update(JoinToken).where(JoinToken.id.in_(list(was))).values(revoked_at=now))
    for token_id, frm in was.items():
        lifecycle.record(
            session,
            kind=KIND,
            resource_id=token_id,
            name=reg.name,
            actor=actor,
            table=JOIN_TOKEN_TRANSITIONS,
            frm=frm,
            to=JoinTokenState.REVOKED,
            reason="revoked by operator",
        )
    session.flush()
    return len(rows)


def revoke_one(session: Session, region: str, token_id: str, *, actor: str) -> tuple[JoinToken, bool]:
    """Revoke one token of `region` (media carrying it stop enrolling nodes); the row, and whether this
    call revoked it (False: it already was, and nothing changed)."""
    reg = region_service.get(session, region)
    row = session.scalar(select(JoinToken).where(JoinToken.id == token_id, JoinToken.region_id == reg.id))
    if row is None:
        raise NotFound(
            f"region '{reg.name}' has no join token {token_id!r}: "
            f"see provision region join-token {reg.name} --list",
            code="join_token_not_found",
        )
    return row, _revoke_row(session, row, reg.name, actor=actor, reason="revoked by operator")


def revoke_issued(session: Session, token: str, *, actor: str, reason: str) -> bool:
    """Revoke the token this control plane issued as `token` (the secret itself, e.g. the one a burst VM
    was created with, which nobody needs once the VM is gone); whether this call revoked it."""
    row = session.scalar(select(JoinToken).where(JoinToken.token_sha256 == digest(token)))
    if row is None:
        return False
    return _revoke_row(session, row, session.get_one(Region, row.region_id).name, actor=actor, reason=reason)


def _revoke_row(session: Session, row: JoinToken, region_name: str, *, actor: str, reason: str) -> bool:
    if row.revoked_at is not None:
        return False
    now = datetime.now(UTC)
    frm = join_token_state(None, row.expires_at, now)
    row.revoked_at = now
    lifecycle.record(
        session,
        kind=KIND,
        resource_id=row.id,
        name=region_name,
        actor=actor,
        table=JOIN_TOKEN_TRANSITIONS,
        frm=frm,
        to=JoinTokenState.REVOKED,
        reason=reason,
    )
    session.flush()
    return True


def list_for(session: Session, region: str) -> list[JoinToken]:
    reg = region_service.get(session, region)
    return list(
        session.scalars(select(JoinToken).where(JoinToken.region_id == reg.id).order_by(JoinToken.created_at))
    )


def bundle(
    session: Session, region: Region, token: str, *, control_plane_url: str, ca_certificate: str | None = None
) -> dict[str, Any]:
    """The region enrollment bundle wrapping `token` (docs/enrollment-bundle.md, the contract with the
    image builder and the minion). The one place it is built: `POST /v1/regions/{ref}/bundle` and the
    GCP storage node's instance metadata both call this, so the two can never drift apart."""
    row = session.scalar(select(JoinToken).where(JoinToken.token_sha256 == digest(token)))
    expires = row.expires_at if row is not None else None
    return EnrollmentBundle(
        control_plane_url=control_plane_url,
        ca_certificate=ca_certificate,
        region=region.name,
        region_id=region.id,
        provider=region.provider.kind,
        join_token=token,
        expires_at=expires.isoformat().replace("+00:00", "Z") if expires else None,
        storage_mode=region.storage_mode,
        public_jobs=region.public_jobs,
    ).model_dump(mode="json")


def resolve(session: Session, token: str, now: datetime | None = None) -> tuple[JoinToken, Region] | Refusal:
    """The token's row and region, or the refusal a minion gets for it."""
    row = session.scalar(select(JoinToken).where(JoinToken.token_sha256 == digest(token)))
    if row is None:
        return refuse(RefusalCode.join_token_invalid)
    if row.revoked_at is not None:
        return refuse(
            RefusalCode.join_token_revoked,
            f"token {row.id} revoked at {row.revoked_at.isoformat()}",
            token_id=row.id,
        )
    now = now or datetime.now(UTC)
    if row.expires_at is not None and now > row.expires_at:
        return refuse(
            RefusalCode.join_token_expired,
            f"token {row.id} expired at {row.expires_at.isoformat()}",
            token_id=row.id,
        )
    region = session.get(Region, row.region_id)
    if region is None or region.state in REGION_LEAVING:
        return refuse(RefusalCode.join_token_revoked, "its region was removed", token_id=row.id)
    return row, region
