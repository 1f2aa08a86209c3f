"""job_metrics: the metric points workers print, and each worker's metric counters; job_worker_usage:
the usage samples of workers' containers; nodes.gpu_count and gpu_type, summed up from each node's
inventory report (filled here for the nodes there are).

Revision ID: 0028_job_metrics
Revises: 0027_project_keys
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from provisioner.domain.inventory_gpus import gpu_summary

revision = "0028_job_metrics"
down_revision = "0027_project_keys"
branch_labels = None
depends_on = None

# Plain ALTER TABLE, not batch mode (as 0025): batch mode would copy `nodes` into a new table and drop
# the old one, which SQLite refuses while other rows refer to it and foreign keys are enforced.

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
    op.add_column(
        "job_workers", sa.Column("metrics_scanned", sa.BigInteger(), nullable=False, server_default="0")
    )
    for name in COUNTERS:
        op.add_column("job_workers", sa.Column(name, sa.Integer(), nullable=False, server_default="0"))
    op.add_column("job_workers", sa.Column("metrics_refusal", sa.Text(), nullable=True))
    op.add_column("job_workers", sa.Column("usage_at", sa.Float(), nullable=True))
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
    op.add_column("nodes", sa.Column("gpu_count", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("nodes", sa.Column("gpu_type", sa.String(length=128), nullable=True))
    bind = op.get_bind()
    nodes = sa.table(
        "nodes",
        sa.column("id"),
        sa.column("inventory", sa.JSON()),
        sa.column("gpu_count"),
        sa.column("gpu_type"),
    )
    for node_id, inventory in bind.execute(sa.select(nodes.c.id, nodes.c.inventory)).all():
        count, kind = gpu_summary(inventory)
        if count:
            bind.execute(nodes.update().where(nodes.c.id == node_id).values(gpu_count=count, gpu_type=kind))


def downgrade() -> None:
    op.drop_column("nodes", "gpu_type")
    op.drop_column("nodes", "gpu_count")
    op.drop_index("ix_job_worker_usage_job_worker_at", table_name="job_worker_usage")
    op.drop_table("job_worker_usage")
    for name in ("usage_at", "metrics_refusal", *reversed(COUNTERS), "metrics_scanned"):
        op.drop_column("job_workers", name)
    op.drop_index("ix_job_metrics_job_id_id", table_name="job_metrics")
    op.drop_table("job_metrics")
