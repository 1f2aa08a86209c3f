"""nodes.lab_root goes: the control plane no longer runs playbooks, a lab node's minion finalizes its root

Revision ID: 0012_drop_lab_root
Revises: 0011_node_finalize_actual
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012_drop_lab_root"
down_revision = "0011_node_finalize_actual"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_column("lab_root")


def downgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("lab_root", sa.Text(), nullable=True))
