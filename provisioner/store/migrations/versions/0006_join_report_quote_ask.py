"""join report held until proof; beat of the outstanding quote request

Revision ID: 0006_join_report_quote_ask
Revises: 0005_images
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_join_report_quote_ask"
down_revision = "0005_images"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("join_attempts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("report", sa.JSON(), nullable=True))
    with op.batch_alter_table("node_attestations", schema=None) as batch_op:
        batch_op.add_column(sa.Column("quote_asked_beat", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("node_attestations", schema=None) as batch_op:
        batch_op.drop_column("quote_asked_beat")
    with op.batch_alter_table("join_attempts", schema=None) as batch_op:
        batch_op.drop_column("report")
