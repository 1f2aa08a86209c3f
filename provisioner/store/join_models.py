"""Store models of the attested join: region join tokens, trusted TPM vendor CAs, attestation nonces,
join attempts between challenge and proof, pending minions, and each node's attestation record
(its AK, PCR baseline, node credential hash and continuous-attestation counters).

Secrets are never stored in the clear: join tokens and node credentials are kept as SHA-256 hashes
(256-bit random values, so a plain hash is enough), the credential secret of a join attempt only as
its hash (inside `PendingJoin`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, ForeignKey, Index, Integer, LargeBinary, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from provisioner.store.models import Base, UTCDateTime, new_id, utcnow


class JoinToken(Base):
    """A region join token (what the enrollment bundle carries): its SHA-256, and for a bundle's token the
    token sealed, so the region's next bundle can carry it again."""

    __tablename__ = "join_tokens"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: new_id("jtk"))
    region_id: Mapped[str] = mapped_column(ForeignKey("regions.id"), index=True)
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    created_by: Mapped[str] = mapped_column(String(128))
    sealed_token: Mapped[str | None] = mapped_column(Text)


class TpmVendorCa(Base):
    """A trust anchor for EK certificates (`provision tpm-ca add`)."""

    __tablename__ = "tpm_vendor_cas"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: new_id("tca"))
    subject: Mapped[str] = mapped_column(Text)
    sha256: Mapped[str] = mapped_column(String(64), unique=True)  # of the DER certificate
    pem: Mapped[str] = mapped_column(Text)
    not_after: Mapped[datetime] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class AttestationNonce(Base):
    """A nonce of the database-backed NonceStore: spent by a conditional UPDATE (used = false → true),
    so two API processes can never both accept one nonce."""

    __tablename__ = "attestation_nonces"

    nonce: Mapped[str] = mapped_column(String(64), primary_key=True)  # hex
    subject: Mapped[str] = mapped_column(String(80))
    issued_at: Mapped[datetime] = mapped_column(UTCDateTime)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    used: Mapped[bool] = mapped_column(Boolean, default=False)


class JoinAttempt(Base):
    """Between POST /v1/join and its proof: the PendingJoin (JSON) and which token opened it."""

    __tablename__ = "join_attempts"

    join_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    region_id: Mapped[str] = mapped_column(ForeignKey("regions.id"))
    minion_id: Mapped[str] = mapped_column(String(32), index=True)
    token_sha256: Mapped[str] = mapped_column(String(64))
    pending: Mapped[str] = mapped_column(Text)  # PendingJoin.model_dump_json()
    # What the minion reported with its JoinRequest (inventory, requirements): unproven until the proof
    # verifies, so it waits here and finish() applies it (docs/join-protocol.md)
    report: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)


class PendingMinion(Base):
    """A minion that reached the control plane but no operator has added yet (`provision node pending`)."""

    __tablename__ = "pending_minions"
    __table_args__ = (Index("ix_pending_minions_region", "region_id"),)

    minion_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    region_id: Mapped[str] = mapped_column(ForeignKey("regions.id"))
    ek_sha256: Mapped[str] = mapped_column(String(64))
    first_seen: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_seen: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    attested: Mapped[bool] = mapped_column(Boolean, default=False)
    inventory: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    requirements: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    refusal: Mapped[str | None] = mapped_column(Text)  # the last refusal's message, if any
    identity: Mapped[str] = mapped_column(String(16), default="tpm", server_default="tpm")  # MinionIdentity


class NodeAttestation(Base):
    """What a successful join recorded for a node, used by every later heartbeat."""

    __tablename__ = "node_attestations"

    node_id: Mapped[str] = mapped_column(ForeignKey("nodes.id"), primary_key=True)
    ek_sha256: Mapped[str] = mapped_column(String(64))  # a device key's: SHA-256 of its SPKI
    ak_public: Mapped[bytes] = mapped_column(LargeBinary)  # a device key's: its DER SPKI
    identity: Mapped[str] = mapped_column(String(16), default="tpm", server_default="tpm")  # MinionIdentity
    pcr_record: Mapped[dict[str, str] | None] = mapped_column(JSON)  # record mode baseline, index → hex
    credential_sha256: Mapped[str | None] = mapped_column(String(64), unique=True)
    attested_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    quote_nonce: Mapped[str | None] = mapped_column(
        String(64)
    )  # hex; outstanding continuous-attestation nonce
    last_quote_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # the node's beat count (Node.heartbeats) when the outstanding quote was first asked for: a node that has
    # not answered within HeartbeatTiming.quote_grace_beats beats of it goes errored (None: nothing asked)
    quote_asked_beat: Mapped[int | None] = mapped_column(Integer)


class RejectedMinion(Base):
    """A minion_id an operator rejected (`provision node reject`): its joins are refused until
    `provision node unreject` deletes the row (the audit trail keeps both)."""

    __tablename__ = "rejected_minions"

    minion_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    reason: Mapped[str | None] = mapped_column(Text)
    created_by: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
