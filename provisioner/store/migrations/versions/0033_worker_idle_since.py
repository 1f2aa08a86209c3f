"""job_workers.idle_since: since when a notebook's or endpoint's server has been idle, as its node last
reported it (contracts/jobs.py WorkerReport.idle_s). The autostop rule (services/jobs/job_autostop.py)
stops a job idle for longer than its `autostop_minutes`, and the console shows how long is left.

Revision ID: 0033_worker_idle_since
Revises: 0032_node_object_cache
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0033_worker_idle_since"
down_revision = "0032_node_object_cache"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("job_workers", sa.Column("idle_since", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("job_workers", "idle_since")
