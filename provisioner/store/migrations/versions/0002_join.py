"""join: join tokens, trusted TPM CAs, pending minions, node credentials, PCR records

Revision ID: 0002_join
Revises: 0001_foundation
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_join"
down_revision = "0001_foundation"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "attestation_nonces",
        sa.Column("nonce", sa.String(length=64), nullable=False),
        sa.Column("subject", sa.String(length=80), nullable=False),
        sa.Column("issued_at", TS, nullable=False),
        sa.Column("expires_at", TS, nullable=False),
        sa.Column("used", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("nonce"),
    )
    op.create_index(
        op.f("ix_attestation_nonces_expires_at"), "attestation_nonces", ["expires_at"], unique=False
    )
    op.create_table(
        "tpm_vendor_cas",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("subject", sa.Text(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("pem", sa.Text(), nullable=False),
        sa.Column("not_after", TS, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("sha256"),
    )
    op.create_table(
        "join_attempts",
        sa.Column("join_id", sa.String(length=40), nullable=False),
        sa.Column("region_id", sa.String(length=32), nullable=False),
        sa.Column("minion_id", sa.String(length=32), nullable=False),
        sa.Column("token_sha256", sa.String(length=64), nullable=False),
        sa.Column("pending", sa.Text(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.ForeignKeyConstraint(
            ["region_id"],
            ["regions.id"],
        ),
        sa.PrimaryKeyConstraint("join_id"),
    )
    op.create_index(op.f("ix_join_attempts_created_at"), "join_attempts", ["created_at"], unique=False)
    op.create_index(op.f("ix_join_attempts_minion_id"), "join_attempts", ["minion_id"], unique=False)
    op.create_table(
        "join_tokens",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("region_id", sa.String(length=32), nullable=False),
        sa.Column("token_sha256", sa.String(length=64), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("expires_at", TS, nullable=True),
        sa.Column("revoked_at", TS, nullable=True),
        sa.Column("created_by", sa.String(length=128), nullable=False),
        sa.ForeignKeyConstraint(
            ["region_id"],
            ["regions.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("token_sha256"),
    )
    op.create_index(op.f("ix_join_tokens_region_id"), "join_tokens", ["region_id"], unique=False)
    op.create_table(
        "pending_minions",
        sa.Column("minion_id", sa.String(length=32), nullable=False),
        sa.Column("region_id", sa.String(length=32), nullable=False),
        sa.Column("ek_sha256", sa.String(length=64), nullable=False),
        sa.Column("first_seen", TS, nullable=False),
        sa.Column("last_seen", TS, nullable=False),
        sa.Column("attested", sa.Boolean(), nullable=False),
        sa.Column("inventory", sa.JSON(), nullable=True),
        sa.Column("requirements", sa.JSON(), nullable=True),
        sa.Column("refusal", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["region_id"],
            ["regions.id"],
        ),
        sa.PrimaryKeyConstraint("minion_id"),
    )
    op.create_index("ix_pending_minions_region", "pending_minions", ["region_id"], unique=False)
    op.create_table(
        "node_attestations",
        sa.Column("node_id", sa.String(length=32), nullable=False),
        sa.Column("ek_sha256", sa.String(length=64), nullable=False),
        sa.Column("ak_public", sa.LargeBinary(), nullable=False),
        sa.Column("pcr_record", sa.JSON(), nullable=True),
        sa.Column("credential_sha256", sa.String(length=64), nullable=True),
        sa.Column("attested_at", TS, nullable=False),
        sa.Column("heartbeats", sa.Integer(), nullable=False),
        sa.Column("quote_nonce", sa.String(length=64), nullable=True),
        sa.Column("last_quote_at", TS, nullable=True),
        sa.ForeignKeyConstraint(
            ["node_id"],
            ["nodes.id"],
        ),
        sa.PrimaryKeyConstraint("node_id"),
        sa.UniqueConstraint("credential_sha256"),
    )
    op.add_column("nodes", sa.Column("pinned_ek_public", sa.LargeBinary(), nullable=True))
    op.add_column("nodes", sa.Column("lab_root", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("lab_root")
        batch.drop_column("pinned_ek_public")
    op.drop_table("node_attestations")
    op.drop_index("ix_pending_minions_region", table_name="pending_minions")
    op.drop_table("pending_minions")
    op.drop_index(op.f("ix_join_tokens_region_id"), table_name="join_tokens")
    op.drop_table("join_tokens")
    op.drop_index(op.f("ix_join_attempts_minion_id"), table_name="join_attempts")
    op.drop_index(op.f("ix_join_attempts_created_at"), table_name="join_attempts")
    op.drop_table("join_attempts")
    op.drop_table("tpm_vendor_cas")
    op.drop_index(op.f("ix_attestation_nonces_expires_at"), table_name="attestation_nonces")
    op.drop_table("attestation_nonces")
