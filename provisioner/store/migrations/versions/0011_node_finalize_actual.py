"""what a node's minion last reported of its finalize (state, generation, facts such as scratch and export)

Revision ID: 0011_node_finalize_actual
Revises: 0010_rejected_minions
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011_node_finalize_actual"
down_revision = "0010_rejected_minions"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("finalize_actual", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_column("finalize_actual")
