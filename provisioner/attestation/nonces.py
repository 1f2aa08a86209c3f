"""Attestation nonces: random, bound to one subject (a join or a node), valid 60 s, usable once.

Storage is behind `NonceStore` so the API can keep nonces in its database (several API workers must
agree that a nonce is spent) while tests and the lab use `MemoryNonceStore`. The one operation that
must be atomic is `consume`: it marks the nonce used and says whether it already was, so two racing
proofs with the same nonce cannot both pass. Spent nonces are kept until `purge` so that a replay is
reported as a replay, not as an unknown nonce.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Protocol

from provisioner.attestation.refusals import Refusal, RefusalCode, refuse

NONCE_TTL = timedelta(seconds=60)
NONCE_BYTES = 32  # the quote's extraData holds at most the AK's digest size (32 for sha256)

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class NonceRecord:
    nonce: bytes
    subject: str  # what the nonce was issued for: "join:<id>" or "node:<id>"
    issued_at: datetime
    expires_at: datetime
    used: bool = False


class NonceStore(Protocol):
    def put(self, record: NonceRecord) -> None:
        """Store a freshly issued nonce."""

    def consume(self, nonce: bytes) -> NonceRecord | None:
        """Atomically mark `nonce` used; return the record as it was *before* (None if never issued)."""

    def purge(self, before: datetime) -> int:
        """Forget nonces that expired before `before`; return how many."""


class MemoryNonceStore:
    """In-process NonceStore (tests, the lab, a single-worker control plane)."""

    def __init__(self) -> None:
        self._records: dict[bytes, NonceRecord] = {}
        self._lock = threading.Lock()

    def put(self, record: NonceRecord) -> None:
        with self._lock:
            self._records[record.nonce] = record

    def consume(self, nonce: bytes) -> NonceRecord | None:
        with self._lock:
            record = self._records.get(nonce)
            if record is not None:
                self._records[nonce] = replace(record, used=True)
            return record

    def purge(self, before: datetime) -> int:
        with self._lock:
            stale = [n for n, r in self._records.items() if r.expires_at < before]
            for n in stale:
                del self._records[n]
            return len(stale)


class NonceIssuer:
    """Issues and redeems nonces against a store, on an injectable clock (tests move time, never sleep)."""

    def __init__(self, store: NonceStore, *, clock: Clock = utc_now, ttl: timedelta = NONCE_TTL) -> None:
        self.store = store
        self.clock = clock
        self.ttl = ttl

    def issue(self, subject: str) -> NonceRecord:
        now = self.clock()
        record = NonceRecord(secrets.token_bytes(NONCE_BYTES), subject, now, now + self.ttl)
        self.store.put(record)
        return record

    def redeem(self, nonce: bytes, subject: str) -> Refusal | None:
        """Spend `nonce` for `subject`; a refusal says why it cannot be spent. Spending happens even
        when the answer is a refusal, so every nonce gets exactly one try."""
        record = self.store.consume(nonce)
        if record is None:
            return refuse(RefusalCode.nonce_unknown)
        if record.used:
            return refuse(RefusalCode.nonce_replayed, issued_at=record.issued_at.isoformat())
        if record.subject != subject:
            return refuse(RefusalCode.nonce_mismatch, issued_for=record.subject)
        now = self.clock()
        if now > record.expires_at:
            late = (now - record.expires_at).total_seconds()
            return refuse(
                RefusalCode.nonce_expired, f"{late:.0f} s past its {self.ttl.total_seconds():.0f} s lifetime"
            )
        return None


@dataclass(frozen=True)
class LateAnswer:
    """A heartbeat's answer over a nonce that expired before it arrived: once the answer verifies, late
    rather than refused (provisioner/attestation/continuous.py says why)."""

    expired: Refusal  # the nonce's refusal, which says how late

    @property
    def detail(self) -> str:
        return str(self.expired.detail.get("summary", "past its lifetime"))


def redeem_allowing_late(nonces: NonceIssuer, nonce: bytes, subject: str) -> Refusal | LateAnswer | None:
    """Spend `nonce`: None when fresh, LateAnswer when it expired (the answer is still checked), and the
    refusal otherwise (unknown, replayed, another node's)."""
    refusal = nonces.redeem(nonce, subject)
    if refusal is not None and refusal.code == RefusalCode.nonce_expired:
        return LateAnswer(refusal)
    return refusal
