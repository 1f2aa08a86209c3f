"""job_workers.ended_at: when the control plane recorded a worker's end (the log-shipping window runs
from it, not from the node's later reports); jobs.sealed_env: a job's secret environment values, sealed;
console_session_ends: signed-out console sessions, kept in
the store so that a restart (or another API process) refuses them too; accounts.uid_slot: each account's
user namespace range on the nodes, numbered for older accounts in the order they were created.

Revision ID: 0026_tenancy
Revises: 0025_beat_count_on_node
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0026_tenancy"
down_revision = "0025_beat_count_on_node"
branch_labels = None
depends_on = None

_SLOTS = (
    "UPDATE accounts SET uid_slot = (SELECT COUNT(*) FROM accounts a "
    "WHERE a.created_at < accounts.created_at OR (a.created_at = accounts.created_at AND a.id < accounts.id))"
)
_ENDED = "UPDATE job_workers SET ended_at = updated_at WHERE state IN ('succeeded', 'failed', 'stopped')"


def upgrade() -> None:
    op.add_column("job_workers", sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True))
    op.execute(_ENDED)
    op.add_column("jobs", sa.Column("sealed_env", sa.Text(), nullable=True))
    op.create_table(
        "console_session_ends",
        sa.Column("sid", sa.String(length=64), primary_key=True),
        sa.Column("until", sa.DateTime(timezone=True), nullable=False, index=True),
    )
    op.add_column("accounts", sa.Column("uid_slot", sa.Integer(), nullable=True))
    op.execute(_SLOTS)
    op.create_index("ix_accounts_uid_slot", "accounts", ["uid_slot"], unique=True)


def downgrade() -> None:
    op.drop_index("ix_accounts_uid_slot", table_name="accounts")
    op.drop_column("accounts", "uid_slot")
    op.drop_table("console_session_ends")
    op.drop_column("jobs", "sealed_env")
    op.drop_column("job_workers", "ended_at")
