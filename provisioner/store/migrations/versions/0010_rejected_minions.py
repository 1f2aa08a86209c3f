"""rejected minions: `provision node reject` refuses a minion_id's joins until `node unreject`

Revision ID: 0010_rejected_minions
Revises: 0009_boot_path_event_log
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010_rejected_minions"
down_revision = "0009_boot_path_event_log"
branch_labels = None
depends_on = None
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "rejected_minions",
        sa.Column("minion_id", sa.String(length=32), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("created_by", sa.String(length=128), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("minion_id"),
    )


def downgrade() -> None:
    op.drop_table("rejected_minions")
