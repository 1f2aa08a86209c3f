"""billing: the append-only double-entry ledger (amounts in integer micro-credits, one row per idempotency
key) and the operator's public GPU price list

Revision ID: 0016_billing
Revises: 0015_jobs
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016_billing"
down_revision = "0015_jobs"
branch_labels = None
depends_on = None
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "ledger_entries",
        sa.Column(
            "id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False
        ),
        sa.Column("key", sa.String(length=200), nullable=False),
        sa.Column("rule", sa.String(length=32), nullable=False),
        sa.Column("subject", sa.String(length=16), nullable=False),
        sa.Column("payer", sa.String(length=48), nullable=False),
        sa.Column("payee", sa.String(length=48), nullable=False),
        sa.Column("amount_micros", sa.BigInteger(), nullable=False),
        sa.Column("quantity_micros", sa.BigInteger(), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=True),
        sa.Column("worker", sa.Integer(), nullable=True),
        sa.Column("hour", sa.Integer(), nullable=True),
        sa.Column("day", sa.String(length=10), nullable=True),
        sa.Column("region_id", sa.String(length=32), nullable=True),
        sa.Column("gpu_type", sa.String(length=64), nullable=True),
        sa.Column("period_start", TS, nullable=True),
        sa.Column("period_end", TS, nullable=True),
        sa.Column("at", TS, nullable=False),
        sa.Column("recorded_at", TS, nullable=False),
        sa.Column("memo", sa.Text(), nullable=True),
        sa.CheckConstraint("amount_micros >= 0", name="ck_ledger_entries_amount_not_negative"),
        sa.CheckConstraint("payer != payee", name="ck_ledger_entries_two_accounts"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("key"),
    )
    op.create_index("ix_ledger_entries_payer_at", "ledger_entries", ["payer", "at"])
    op.create_index("ix_ledger_entries_payee_at", "ledger_entries", ["payee", "at"])
    op.create_index("ix_ledger_entries_job", "ledger_entries", ["job_id", "hour"])
    op.create_index("ix_ledger_entries_region_id", "ledger_entries", ["region_id"])
    op.create_table(
        "gpu_prices",
        sa.Column("gpu_type", sa.String(length=64), nullable=False),
        sa.Column("price_micros", sa.BigInteger(), nullable=False),
        sa.Column("updated_by", sa.String(length=128), nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("gpu_type"),
    )


def downgrade() -> None:
    op.drop_table("gpu_prices")
    op.drop_index("ix_ledger_entries_region_id", table_name="ledger_entries")
    op.drop_index("ix_ledger_entries_job", table_name="ledger_entries")
    op.drop_index("ix_ledger_entries_payee_at", table_name="ledger_entries")
    op.drop_index("ix_ledger_entries_payer_at", table_name="ledger_entries")
    op.drop_table("ledger_entries")
