"""job_metrics: the metric points workers print, and each worker's metric counters; job_worker_usage:
the usage samples of workers' containers.

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
USAGE_BYTES = ("memory_bytes", "disk_bytes", "net_rx_bytes", "net_tx_bytes")


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
        batch.add_column(sa.Column("usage_at", sa.Float(), nullable=True))
    op.create_table(
        "job_worker_usage",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(length=32), sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("worker", sa.Integer(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("resolution_s", sa.Integer(), nullable=False),
        sa.Column("cpu_cores", sa.Float(), nullable=False),
        *(sa.Column(name, sa.BigInteger(), nullable=False) for name in USAGE_BYTES),
        sa.Column("gpus", sa.JSON(), nullable=False),
    )
    op.create_index("ix_job_worker_usage_job_worker_at", "job_worker_usage", ["job_id", "worker", "at"])


def downgrade() -> None:
    op.drop_index("ix_job_worker_usage_job_worker_at", table_name="job_worker_usage")
    op.drop_table("job_worker_usage")
    with op.batch_alter_table("job_workers") as batch:
        for name in ("usage_at", "metrics_refusal", *reversed(COUNTERS), "metrics_scanned"):
            batch.drop_column(name)
    op.drop_index("ix_job_metrics_job_id_id", table_name="job_metrics")
    op.drop_table("job_metrics")
