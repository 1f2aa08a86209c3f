"""The console's sign-in session and CSRF tokens, with no table of their own.

The session cookie holds a signed value: a random session id, the operator token's row id and a short
fingerprint of its stored digest, and the time of sign-in. It never holds the token (nor anything the
token can be derived from). Each request re-reads the token's row, so a revoked, expired or rotated token
ends the console session at the next page, as it ends API access. Signing out remembers the session id in
this process until the session would have expired anyway (with `--workers N`, in the worker that answered:
the cookie is cleared in the browser in every case).

The signing key is derived from the control plane's secret key (`$RIGBASE_HOME/secret.key`, which seals
secrets at rest), so sessions survive a restart and a backup/restore, and no new key file is needed.

CSRF: every form carries HMAC(key, session id); a post without it, or with another session's, is refused.
The sign-in form has no session yet: it carries HMAC(key, nonce) where the nonce is in a short-lived
pre-session cookie (double submit), so a foreign site cannot sign a browser in to its own token."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Final

from provisioner.adapters.secrets import Sealer

SESSION_COOKIE: Final = "rigbase_console"
SIGNIN_COOKIE: Final = "rigbase_console_signin"
FLASH_COOKIE: Final = "rigbase_console_flash"
SESSION_MAX_AGE_S: Final = 12 * 3600  # a working day; then sign in again
SIGNIN_MAX_AGE_S: Final = 3600
FINGERPRINT_CHARS: Final = 16  # of the token's stored SHA-256: a rotated token no longer matches
_KEY_LABEL: Final = b"rigbase console session v1"


def signing_key(sealer: Sealer) -> bytes:
    """The console's HMAC key, derived from the control plane's secret key (created on first use)."""
    return sealer.derive(_KEY_LABEL)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True)
class SessionValue:
    """What the session cookie says, once its signature checked out."""

    sid: str
    token_id: str
    fingerprint: str
    issued_at: float


@dataclass
class Signer:
    """Signs and checks the console's cookies and CSRF tokens with one key."""

    key: bytes
    _ended: dict[str, float] = field(default_factory=dict)  # signed-out sid -> when it would expire

    def _now(self) -> float:
        return time.time()

    def _mac(self, purpose: str, payload: str) -> str:
        return _b64(hmac.new(self.key, f"{purpose}|{payload}".encode(), hashlib.sha256).digest())

    def sign(self, purpose: str, data: dict[str, object]) -> str:
        payload = _b64(json.dumps(data, separators=(",", ":"), sort_keys=True).encode())
        return f"{payload}.{self._mac(purpose, payload)}"

    def unsign(self, purpose: str, value: str | None, max_age_s: float) -> dict[str, object] | None:
        """The data of a value this signer signed for `purpose` within `max_age_s`; None otherwise."""
        if not value or value.count(".") != 1:
            return None
        payload, mac = value.split(".")
        if not hmac.compare_digest(mac, self._mac(purpose, payload)):
            return None
        try:
            data = json.loads(_unb64(payload))
        except ValueError:
            return None
        at = data.get("at") if isinstance(data, dict) else None
        if not isinstance(at, int | float) or not 0 <= self._now() - at <= max_age_s:
            return None
        return data

    # ------------------------------------------------------------------ the session

    def new_session(self, token_id: str, token_sha256: str) -> str:
        return self.sign(
            "session",
            {
                "sid": secrets.token_urlsafe(16),
                "tid": token_id,
                "fp": token_sha256[:FINGERPRINT_CHARS],
                "at": int(self._now()),
            },
        )

    def session(self, cookie: str | None) -> SessionValue | None:
        data = self.unsign("session", cookie, SESSION_MAX_AGE_S)
        if data is None or str(data.get("sid")) in self._ended:
            return None
        return SessionValue(
            sid=str(data["sid"]),
            token_id=str(data["tid"]),
            fingerprint=str(data["fp"]),
            issued_at=float(data["at"]),  # type: ignore[arg-type]
        )

    def end(self, value: SessionValue) -> None:
        """Sign out: this session id is refused from now on (in this process)."""
        now = self._now()
        self._ended = {sid: until for sid, until in self._ended.items() if until > now}
        self._ended[value.sid] = value.issued_at + SESSION_MAX_AGE_S

    # ------------------------------------------------------------------ CSRF

    def csrf_for(self, sid: str) -> str:
        return self._mac("csrf", sid)

    def csrf_ok(self, sid: str, sent: str | None) -> bool:
        return bool(sent) and hmac.compare_digest(str(sent), self.csrf_for(sid))

    def new_signin_nonce(self) -> str:
        return self.sign("signin", {"nonce": secrets.token_urlsafe(16), "at": int(self._now())})

    def signin_nonce(self, cookie: str | None) -> str | None:
        data = self.unsign("signin", cookie, SIGNIN_MAX_AGE_S)
        return str(data["nonce"]) if data else None

    # ------------------------------------------------------------------ one-shot messages

    def flash(self, kind: str, message: str) -> str:
        # a cookie holds about 4 KiB: a one-line message fits, a pathological one is cut
        return self.sign("flash", {"kind": kind, "message": message[:1500], "at": int(self._now())})

    def read_flash(self, cookie: str | None) -> tuple[str, str] | None:
        data = self.unsign("flash", cookie, 300)
        return (str(data["kind"]), str(data["message"])) if data else None
