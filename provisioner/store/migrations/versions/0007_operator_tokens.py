"""operator tokens: expiry, last use, revocation

Revision ID: 0007_operator_tokens
Revises: 0006_join_report_quote_ask
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_operator_tokens"
down_revision = "0006_join_report_quote_ask"
branch_labels = None
depends_on = None
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.add_column(sa.Column("expires_at", TS, nullable=True))
        batch_op.add_column(sa.Column("last_used_at", TS, nullable=True))
        batch_op.add_column(sa.Column("revoked_at", TS, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.drop_column("revoked_at")
        batch_op.drop_column("last_used_at")
        batch_op.drop_column("expires_at")
