"""job_metrics: the metric points workers print, and each worker's metric counters.

Revision ID: 0028_job_metrics
Revises: 0027_project_keys
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0028_job_metrics"
down_revision = "0027_project_keys"
branch_labels = None
depends_on = None

COUNTERS = ("metric_points", "metrics_dropped", "metrics_refused")


def upgrade() -> None:
    op.create_table(
        "job_metrics",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(length=32), sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("worker", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=True),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_job_metrics_job_id_id", "job_metrics", ["job_id", "id"])
    with op.batch_alter_table("job_workers") as batch:
        batch.add_column(sa.Column("metrics_scanned", sa.BigInteger(), nullable=False, server_default="0"))
        for name in COUNTERS:
            batch.add_column(sa.Column(name, sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("metrics_refusal", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job_workers") as batch:
        for name in ("metrics_refusal", *reversed(COUNTERS), "metrics_scanned"):
            batch.drop_column(name)
    op.drop_index("ix_job_metrics_job_id_id", table_name="job_metrics")
    op.drop_table("job_metrics")
