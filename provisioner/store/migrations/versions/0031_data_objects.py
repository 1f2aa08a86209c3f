"""data_objects, job_objects and job_outputs: a project's datasets, models and checkpoints, which a job
mounts, and what each worker left in /opt/ml/output.

Revision ID: 0031_data_objects
Revises: 0030_worker_groups
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0031_data_objects"
down_revision = "0030_worker_groups"
branch_labels = None
depends_on = None

NOT_REMOVED = sa.text("state != 'removed'")


def upgrade() -> None:
    op.create_table(
        "data_objects",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("project_id", sa.String(32), sa.ForeignKey("projects.id"), nullable=False),
        sa.Column("account_id", sa.String(32), sa.ForeignKey("accounts.id"), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("endpoint_url", sa.Text(), nullable=True),
        sa.Column("key_name", sa.String(253), nullable=True),
        sa.Column("public", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("job_id", sa.String(32), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("digest", sa.String(71), nullable=True),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("file_count", sa.Integer(), nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ready_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
    )
    op.create_index("ix_data_objects_project_id", "data_objects", ["project_id"])
    op.create_index("ix_data_objects_account_id", "data_objects", ["account_id"])
    op.create_index("ix_data_objects_job_id", "data_objects", ["job_id"])
    op.create_index(
        "uq_data_objects_project_kind_name_live",
        "data_objects",
        ["project_id", "kind", "name"],
        unique=True,
        sqlite_where=NOT_REMOVED,
        postgresql_where=NOT_REMOVED,
    )
    op.create_table(
        "job_objects",
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("object_id", sa.String(32), sa.ForeignKey("data_objects.id"), primary_key=True),
        sa.Column("target", sa.String(4096), nullable=False),
    )
    op.create_index("ix_job_objects_object_id", "job_objects", ["object_id"])
    op.create_table(
        "job_outputs",
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("worker", sa.Integer(), primary_key=True),
        sa.Column("project_id", sa.String(32), sa.ForeignKey("projects.id"), nullable=False),
        sa.Column("digest", sa.String(71), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("file_count", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("destination", sa.Text(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_job_outputs_project_id", "job_outputs", ["project_id"])
    op.create_index("ix_job_outputs_state", "job_outputs", ["state"])


def downgrade() -> None:
    op.drop_table("job_outputs")
    op.drop_table("job_objects")
    op.drop_table("data_objects")
