"""project shares: a project's owner shares it with another account, whose members then create jobs in
it (federated jobs, docs/accounts.md)

Revision ID: 0021_project_shares
Revises: 0020_billing_devices
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021_project_shares"
down_revision = "0020_billing_devices"
branch_labels = None
depends_on = None
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "project_shares",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("project_id", sa.String(length=32), nullable=False),
        sa.Column("account_id", sa.String(length=32), nullable=False),
        sa.Column("created_by", sa.String(length=128), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.ForeignKeyConstraint(["project_id"], ["projects.id"]),
        sa.ForeignKeyConstraint(["account_id"], ["accounts.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("project_id", "account_id", name="uq_project_shares_project_account"),
    )
    op.create_index("ix_project_shares_project_id", "project_shares", ["project_id"])
    op.create_index("ix_project_shares_account_id", "project_shares", ["account_id"])


def downgrade() -> None:
    op.drop_index("ix_project_shares_account_id", table_name="project_shares")
    op.drop_index("ix_project_shares_project_id", table_name="project_shares")
    op.drop_table("project_shares")
