"""job_workers.ended_at: when the control plane recorded a worker's end (the log-shipping window runs
from it, not from the node's later reports); jobs.sealed_env: a job's secret environment values, sealed;
console_session_ends: signed-out console sessions, kept in
the store so that a restart (or another API process) refuses them too.

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


def downgrade() -> None:
    op.drop_table("console_session_ends")
    op.drop_column("jobs", "sealed_env")
    op.drop_column("job_workers", "ended_at")
