"""The database-backed NonceStore (provisioner/attestation/nonces.py): several API processes share the
store, so "spent" must be decided by the database. `consume` is one conditional UPDATE (`used = false →
true`, returning the nonce's record): on PostgreSQL the second of two racing transactions waits on the
row lock and then matches nothing; SQLite serialises writers. Whoever updated the row spent the nonce."""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from sqlalchemy import CursorResult, delete, select, update
from sqlalchemy.orm import Session

from provisioner.attestation.nonces import NonceIssuer, NonceRecord
from provisioner.store.join_models import AttestationNonce


class DbNonceStore:
    def __init__(self, session: Session) -> None:
        self.session = session

    def put(self, record: NonceRecord) -> None:
        self.session.add(
            AttestationNonce(
                nonce=record.nonce.hex(),
                subject=record.subject,
                issued_at=record.issued_at,
                expires_at=record.expires_at,
                used=record.used,
            )
        )
        self.session.flush()

    def consume(self, nonce: bytes) -> NonceRecord | None:
        key = nonce.hex()
        t = AttestationNonce
        # the answer to a fresh nonce in one statement; only a nonce spent already or unknown reads again
        spent = self.session.execute(
            update(t)
            .where(t.nonce == key, t.used.is_(False))
            .values(used=True)
            .returning(t.subject, t.issued_at, t.expires_at)
            .execution_options(synchronize_session=False)
        ).first()
        if spent is not None:
            return NonceRecord(nonce, spent.subject, spent.issued_at, spent.expires_at, used=False)
        row = self.session.execute(select(t.subject, t.issued_at, t.expires_at).where(t.nonce == key)).first()
        if row is None:
            return None
        return NonceRecord(nonce, row.subject, row.issued_at, row.expires_at, used=True)

    def purge(self, before: datetime) -> int:
        deleted = self.session.execute(delete(AttestationNonce).where(AttestationNonce.expires_at < before))
        return cast(CursorResult[Any], deleted).rowcount  # a DML result: see consume


def issuer(session: Session) -> NonceIssuer:
    """The attestation nonce issuer over this unit of work's store (join steps and heartbeats)."""
    return NonceIssuer(DbNonceStore(session))
