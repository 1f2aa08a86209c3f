"""on-node finalize: the retry counter, the last applied generation, the last report's time

Revision ID: 0008_finalize_on_node
Revises: 0007_operator_tokens
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008_finalize_on_node"
down_revision = "0007_operator_tokens"
branch_labels = None
depends_on = None
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("finalize_retry", sa.Integer(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("finalize_applied", sa.String(64), nullable=True))
        batch_op.add_column(sa.Column("finalize_reported_at", TS, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_column("finalize_reported_at")
        batch_op.drop_column("finalize_applied")
        batch_op.drop_column("finalize_retry")
