"""Request limits, enforced before a request reaches FastAPI (docs/control-plane.md, "Limits").

An ASGI middleware, so it acts before any body is read:
- a source address with too many failed authentications lately, or too many join attempts, gets 429 with
  Retry-After and nothing else is done for it (no body read, no database, no audit row);
- a route that needs a bearer token (operator, node credential, join token) answers 401 at once when the
  Authorization header is missing or not of that token's form: an unauthenticated body is never read.
  The full check of the token stays where it is (provisioner/api/deps.py and the services);
- a body larger than its route's cap answers 413: at once when Content-Length says so, after reading at
  most the cap when it is sent chunked.
Every refusal is the API's one-line JSON {code, message}. Failed authentications are counted from the
status the app answers (POLICIES[...].failures), so a well-behaved client never spends from its budget.

A failure budget never refuses a request that authenticates: a bearer credential the app accepted lately
(kept as its SHA-256, in a bounded table) passes an address's empty budget, so bad tokens sent from a
node's or an operator's address cannot lock its valid ones out. Only what cannot be told from a guess
waits.

The counters live in this process's memory: each `provision serve` process (and each restart) counts on
its own, and they key on the TCP peer address as uvicorn gives it: X-Forwarded-For counts only from the
proxies named in `trusted_proxies` (provisioner/settings.py), so a client cannot rotate or aim it."""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Final

from starlette.types import ASGIApp as App
from starlette.types import Message, Receive, Scope, Send

from contracts.data_objects import CHUNK_BYTES
from provisioner.settings import Settings

KiB: Final = 1024
MiB: Final = 1024 * KiB


class Auth(Enum):
    """A bearer token's kind: its prefix (provisioner/services/accounts/tokens.py, node_credentials.py,
    join_tokens.py: prefix + secrets.token_urlsafe(32)), and the code and sentence of the refusal when the
    header is missing or not of that form: the same words as the token's own check, so a client reads
    one refusal whichever check caught it."""

    OPERATOR = (
        "rbo_",
        (
            "token_missing",
            "no bearer token: set RIGBASE_TOKEN or use the client config written by `provision serve`",
        ),
        (
            "token_invalid",
            "the bearer token is not valid: use the token in the client config written by `provision serve`",
        ),
    )
    NODE = (
        "rbn_",
        ("credential_missing", "no node credential: join first (`minion join`)"),
        (
            "credential_invalid",
            "the node credential is not valid (the node was retried, removed or re-added): join again",
        ),
    )
    JOIN = (
        "rbj_",
        (
            "join_token_invalid",
            "the proof must carry the join token that started this join: restart the join",
        ),
        (
            "join_token_invalid",
            "the proof must carry the join token that started this join: restart the join",
        ),
    )

    def __init__(self, prefix: str, missing: tuple[str, str], invalid: tuple[str, str]) -> None:
        self.missing = missing
        self.invalid = invalid
        self.form = re.compile(rf"Bearer {re.escape(prefix)}[A-Za-z0-9_-]{{20,100}}")


# Statuses that count as a failed authentication from the source address: a 403 is an authenticated caller
# whose role is too weak (or a node whose attestation failed, which the join routes count below).
AUTH_FAILED: Final = frozenset({401})
# The join routes are what an unauthenticated client reaches; a malformed join is refused AND audited,
# so it counts too (a flood of them would otherwise write one audit row each).
JOIN_FAILED: Final = AUTH_FAILED | {403, 422}
# the console's sign-in answers a wrong token with a redirect back to the sign-in page (303)
SIGNIN_FAILED: Final = frozenset({303})


@dataclass(frozen=True)
class Policy:
    """What one route may receive. First match in POLICIES wins."""

    method: str | None  # None: any
    path: re.Pattern[str]
    max_body: int
    auth: Auth | None
    failures: frozenset[int] = AUTH_FAILED
    join_attempt: bool = False  # spends from the source's join-attempt budget
    guarded: bool = False  # no bearer header, but answers count and an empty budget refuses (sign-in)


def _path(pattern: str) -> re.Pattern[str]:
    # DOTALL: a decoded path may hold a newline (%0A); every path must find a policy (found by fuzzing)
    return re.compile(pattern, re.DOTALL)


POLICIES: Final[tuple[Policy, ...]] = (
    # JoinRequest: keys, EK certificate (~1.5 KiB) and two reports of at most 32 KiB each
    # (contracts/messages.py REPORT_MAX_BYTES). The join token travels in the body, so no header check.
    Policy("POST", _path(r"/v1/join"), 96 * KiB, None, JOIN_FAILED, join_attempt=True),
    # ProofRequest: the activated secret and a quote over a few PCRs (about 1.2 KiB on the wire) with the
    # firmware's event log, at most 256 KiB raw (contracts/eventlog.py MAX_EVENT_LOG_BYTES), ~342 KiB base64.
    Policy("POST", _path(r"/v1/join/[^/]+/proof"), 384 * KiB, Auth.JOIN, JOIN_FAILED),
    # HeartbeatRequest: three reports of at most 32 KiB each (actual, inventory, requirements) and a quote
    # with its event log (~342 KiB base64, as above).
    Policy("POST", _path(r"/v1/nodes/[^/]+/heartbeat"), 640 * KiB, Auth.NODE),
    # FinalizeReport: at most 100 task events of a 200-character name and a 1000-character message, an
    # outcome, and the play's facts (a report of at most 32 KiB): well under 256 KiB.
    Policy("POST", _path(r"/v1/nodes/[^/]+/finalize"), 256 * KiB, Auth.NODE),
    # A job worker's LogChunk: at most 256 KiB of UTF-8 (contracts/jobs.py LOG_CHUNK_MAX), JSON-escaped (6x).
    Policy("POST", _path(r"/v1/nodes/[^/]+/jobs/[^/]+/workers/[^/]+/logs"), 2 * MiB, Auth.NODE),
    # A device's inference container output: the same LogChunk (contracts/device.py DEVICE_LOG_ROUTE).
    Policy("POST", _path(r"/v1/nodes/[^/]+/device/logs"), 2 * MiB, Auth.NODE),
    # the playbook bundle download: a GET, no body
    Policy("GET", _path(r"/v1/finalize/bundles/[^/]+"), 1 * KiB, Auth.NODE),
    # A node fetching an object a worker of it mounts (contracts/data_objects.py): GETs, no body.
    Policy("GET", _path(r"/v1/nodes/[^/]+/objects/.+"), 1 * KiB, Auth.NODE),
    # A worker's /opt/ml/output going up from its node: the same three steps as an upload (below).
    Policy("POST", _path(r"/v1/nodes/[^/]+/jobs/[^/]+/workers/[^/]+/output/missing"), 16 * MiB, Auth.NODE),
    Policy(
        "PUT",
        _path(r"/v1/nodes/[^/]+/jobs/[^/]+/workers/[^/]+/output/chunks/[^/]+"),
        CHUNK_BYTES + 4 * KiB,
        Auth.NODE,
    ),
    Policy("POST", _path(r"/v1/nodes/[^/]+/jobs/[^/]+/workers/[^/]+/output/manifest"), 64 * MiB, Auth.NODE),
    # An upload's chunk (at most contracts/data_objects.py CHUNK_BYTES), the chunk list of an object of
    # MAX_FILES files at ~67 bytes a chunk, and its manifest (~200 bytes a file).
    Policy("PUT", _path(r"/v1/objects/[^/]+/chunks/[^/]+"), CHUNK_BYTES + 4 * KiB, Auth.OPERATOR),
    Policy("POST", _path(r"/v1/objects/[^/]+/missing"), 16 * MiB, Auth.OPERATOR),
    Policy("POST", _path(r"/v1/objects/[^/]+/manifest"), 64 * MiB, Auth.OPERATOR),
    # An image manifest lists every package of the image (thousands of lines), sent base64-encoded.
    Policy("POST", _path(r"/v1/images"), 8 * MiB, Auth.OPERATOR),
    # Other operator routes carry names, PEM certificates, service-account keys: a few KiB at most.
    Policy(None, _path(r"/v1/.*"), 1 * MiB, Auth.OPERATOR),
    # the Prometheus scrape (api/fleet_metrics.py): an operator token of role scrape, a GET
    Policy("GET", _path(r"/metrics"), 1 * KiB, Auth.OPERATOR),
    # the console's sign-in form: a token guessed there spends from the same budget (redirected back
    # to /signin on a refusal, to the next page on success)
    Policy("POST", _path(r"/signin"), 16 * KiB, None, SIGNIN_FAILED, guarded=True),
    # a notebook's or endpoint's URL (api/job_proxy.py): the proxy checks who calls; JupyterLab uploads a
    # file in chunks of 1 MiB, and an endpoint's request bodies are the job's own business, within this
    Policy(None, _path(r"/j/.*"), 64 * MiB, None),
    # /healthz, /openapi.json and unknown routes: public, and no body worth reading.
    Policy(None, _path(r".*"), 64 * KiB, None),
)


def policy_for(method: str, path: str) -> Policy:
    return next(p for p in POLICIES if p.method in (None, method) and p.path.fullmatch(path))


@dataclass
class _Bucket:
    tokens: float
    at: float


@dataclass
class Buckets:
    """One token bucket per source address: `burst` tokens, refilled at `per_minute`. In memory."""

    burst: int
    per_minute: float
    clock: Callable[[], float] = time.monotonic
    max_sources: int = 100_000  # beyond this many addresses, full (idle) buckets are dropped
    _buckets: dict[str, _Bucket] = field(default_factory=dict)

    def _refilled(self, source: str) -> _Bucket:
        now = self.clock()
        bucket = self._buckets.get(source)
        if bucket is None:
            if len(self._buckets) >= self.max_sources:
                self._drop_idle(now)
            bucket = self._buckets[source] = _Bucket(float(self.burst), now)
        bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.at) * self.per_minute / 60)
        bucket.at = now
        return bucket

    def _drop_idle(self, now: float) -> None:
        full_after = self.burst * 60 / self.per_minute if self.per_minute > 0 else math.inf
        self._buckets = {k: b for k, b in self._buckets.items() if now - b.at < full_after}

    def retry_after(self, source: str) -> int | None:
        """Seconds until `source` has a token again, or None when it has one now."""
        bucket = self._refilled(source)
        if bucket.tokens >= 1:
            return None
        if self.per_minute <= 0:
            return 3600
        return max(1, math.ceil((1 - bucket.tokens) * 60 / self.per_minute))

    def spend(self, source: str) -> None:
        bucket = self._refilled(source)
        bucket.tokens = max(0.0, bucket.tokens - 1)


def _refusal(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> list[Message]:
    body = json.dumps({"code": code, "message": message}).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    return [
        {"type": "http.response.start", "status": status, "headers": raw},
        {"type": "http.response.body", "body": body},
    ]


@dataclass
class GoodCredentials:
    """The SHA-256 of bearer headers the app accepted lately (least recently seen dropped first): such a
    request passes an empty failure budget. A credential answered 401 later (revoked, expired) leaves."""

    max_size: int = 50_000
    _seen: OrderedDict[bytes, None] = field(default_factory=OrderedDict)

    @staticmethod
    def digest(header: str) -> bytes | None:
        return hashlib.sha256(header.encode("latin-1")).digest() if header else None

    def knows(self, digest: bytes | None) -> bool:
        if digest is None or digest not in self._seen:
            return False
        self._seen.move_to_end(digest)
        return True

    def accepted(self, digest: bytes) -> None:
        self._seen[digest] = None
        self._seen.move_to_end(digest)
        if len(self._seen) > self.max_size:
            self._seen.popitem(last=False)

    def refused(self, digest: bytes) -> None:
        self._seen.pop(digest, None)


class _TooLarge(Exception):
    pass


class RequestLimits:
    """The middleware (see the module docstring). `settings` gives the rate-limit parameters."""

    def __init__(self, app: App, settings: Settings) -> None:
        self.app = app
        self.failures = Buckets(settings.auth_failures_burst, settings.auth_failures_per_minute)
        self.joins = Buckets(settings.join_attempts_burst, settings.join_attempts_per_minute)
        self.good = GoodCredentials()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        policy = policy_for(scope["method"], scope["path"])
        source = scope["client"][0] if scope.get("client") else "unknown"
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        credential = GoodCredentials.digest(headers.get("authorization", ""))
        refusal = self._refusal(policy, source, headers, credential)
        if refusal is not None:
            for message in refusal:
                await send(message)
            return
        try:
            body = await self._read(receive, policy.max_body)
        except _TooLarge:
            for message in _too_large(policy):
                await send(message)
            return
        await self.app(scope, _replay(body, receive), self._counting(send, policy, source, credential))

    def _refusal(
        self, policy: Policy, source: str, headers: dict[str, str], credential: bytes | None
    ) -> list[Message] | None:
        """What to answer without reading the body, or None to go on."""
        if policy.auth is not None or policy.join_attempt or policy.guarded:
            wait = self.failures.retry_after(source)
            # a bearer credential proves itself only where the route reads it (not at the sign-in form)
            if wait is not None and not (policy.auth is not None and self.good.knows(credential)):
                return _rate_limited("failed authentications", wait)
        if policy.join_attempt:
            wait = self.joins.retry_after(source)
            if wait is not None:
                return _rate_limited("join attempts", wait)
            self.joins.spend(source)
        if policy.auth is not None and not policy.auth.form.fullmatch(headers.get("authorization", "")):
            self.failures.spend(source)
            code, message = policy.auth.invalid if headers.get("authorization") else policy.auth.missing
            return _refusal(401, code, message, {"WWW-Authenticate": "Bearer"})
        length = headers.get("content-length", "")
        if length and (not length.isdigit() or int(length) > policy.max_body):
            return _too_large(policy)
        return None

    @staticmethod
    async def _read(receive: Receive, limit: int) -> bytes:
        """The whole body (at most `limit` bytes; _TooLarge past it), however it is sent."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _TooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    def _counting(self, send: Send, policy: Policy, source: str, credential: bytes | None) -> Send:
        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                if _failed(policy, message):
                    self.failures.spend(source)
                if credential is not None and policy.auth is not None:
                    if message["status"] == 401:
                        self.good.refused(credential)
                    elif message["status"] not in policy.failures:
                        self.good.accepted(credential)
            await send(message)

        return counted


def _failed(policy: Policy, start: Message) -> bool:
    """Whether the app's answer is a failed authentication for this route."""
    if start["status"] not in policy.failures:
        return False
    if not policy.guarded:
        return True
    # the sign-in redirects both ways (api/console/render.redirect, a path): back to /signin is the refusal
    return dict(start.get("headers") or []).get(b"location", b"").startswith(b"/signin")


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that hands the app the body already read, then the client's later messages."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


def _too_large(policy: Policy) -> list[Message]:
    return _refusal(
        413, "body_too_large", f"the request body is larger than this route accepts ({policy.max_body} bytes)"
    )


def _rate_limited(what: str, wait: int) -> list[Message]:
    return _refusal(
        429,
        "rate_limited",
        f"too many {what} from this address: retry in {wait} s",
        {"Retry-After": str(wait)},
    )
