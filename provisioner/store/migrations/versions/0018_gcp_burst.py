"""GCP burst compute VMs (one per job worker placed on GCP capacity) and the cached quota of each GCP
region that placement reads

Revision ID: 0018_gcp_burst
Revises: 0017_reservation_expose_wan
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018_gcp_burst"
down_revision = "0017_reservation_expose_wan"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gcp_burst_vms",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("worker_index", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.String(length=32), nullable=False),
        sa.Column("region_id", sa.String(length=32), nullable=False),
        sa.Column("instance_name", sa.String(length=63), nullable=False),
        sa.Column("gpu_type", sa.String(length=32), nullable=False),
        sa.Column("gpu_count", sa.Integer(), nullable=False),
        sa.Column("cpus", sa.Integer(), nullable=False),
        sa.Column("local_ssds", sa.Integer(), nullable=False),
        sa.Column("preemptible", sa.Boolean(), nullable=False),
        sa.Column("price_per_gpu_hour", sa.Float(), nullable=False),
        sa.Column("sealed_join_token", sa.Text(), nullable=False),
        sa.Column("preempted_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("zone", sa.String(length=63), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("inserted_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"]),
        sa.ForeignKeyConstraint(["node_id"], ["nodes.id"]),
        sa.ForeignKeyConstraint(["region_id"], ["regions.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("instance_name"),
        sa.UniqueConstraint("node_id"),
    )
    with op.batch_alter_table("gcp_burst_vms", schema=None) as batch_op:
        batch_op.create_index("ix_gcp_burst_vms_job_id", ["job_id"], unique=False)
        batch_op.create_index("ix_gcp_burst_vms_region_id", ["region_id"], unique=False)
        batch_op.create_index("ix_gcp_burst_vms_state", ["state"], unique=False)
    op.create_table(
        "gcp_quota_cache",
        sa.Column("region_id", sa.String(length=32), nullable=False),
        sa.Column("quotas", sa.JSON(), nullable=False),
        sa.Column("fetched_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("bookings", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["region_id"], ["regions.id"]),
        sa.PrimaryKeyConstraint("region_id"),
    )


def downgrade() -> None:
    op.drop_table("gcp_quota_cache")
    with op.batch_alter_table("gcp_burst_vms", schema=None) as batch_op:
        batch_op.drop_index("ix_gcp_burst_vms_state")
        batch_op.drop_index("ix_gcp_burst_vms_region_id")
        batch_op.drop_index("ix_gcp_burst_vms_job_id")
    op.drop_table("gcp_burst_vms")
