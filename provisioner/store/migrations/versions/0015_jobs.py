"""jobs: a job of a project (spec, locked price, placement), its workers (one container each, with state,
exit code and node) and their logs (chunks stored idempotently by byte offset)

Revision ID: 0015_jobs
Revises: 0014_accounts_projects
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015_jobs"
down_revision = "0014_accounts_projects"
branch_labels = None
depends_on = None
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("account_id", sa.String(length=32), nullable=False),
        sa.Column("project_id", sa.String(length=32), nullable=False),
        sa.Column("type", sa.String(length=16), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("price_per_gpu_hour", sa.Float(), nullable=True),
        sa.Column("pinned_region_id", sa.String(length=32), nullable=True),
        sa.Column("region_id", sa.String(length=32), nullable=True),
        sa.Column("node_id", sa.String(length=32), nullable=True),
        sa.Column("gpu_type", sa.String(length=64), nullable=True),
        sa.Column("placements", sa.Integer(), nullable=False),
        sa.Column("created_by", sa.String(length=128), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.Column("started_at", TS, nullable=True),
        sa.Column("ended_at", TS, nullable=True),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["account_id"], ["accounts.id"]),
        sa.ForeignKeyConstraint(["node_id"], ["nodes.id"]),
        sa.ForeignKeyConstraint(["pinned_region_id"], ["regions.id"]),
        sa.ForeignKeyConstraint(["project_id"], ["projects.id"]),
        sa.ForeignKeyConstraint(["region_id"], ["regions.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_jobs_account_id"), "jobs", ["account_id"], unique=False)
    op.create_index("ix_jobs_account_name", "jobs", ["account_id", "name"], unique=False)
    op.create_index(op.f("ix_jobs_node_id"), "jobs", ["node_id"], unique=False)
    op.create_index(op.f("ix_jobs_project_id"), "jobs", ["project_id"], unique=False)
    op.create_index(op.f("ix_jobs_region_id"), "jobs", ["region_id"], unique=False)
    op.create_index(op.f("ix_jobs_state"), "jobs", ["state"], unique=False)
    op.create_table(
        "job_log_chunks",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("worker", sa.Integer(), nullable=False),
        sa.Column("offset", sa.BigInteger(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
        sa.Column("at", TS, nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("uq_job_log_chunks_offset", "job_log_chunks", ["job_id", "worker", "offset"], unique=True)
    op.create_table(
        "job_workers",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("command", sa.Text(), nullable=False),
        sa.Column("node_id", sa.String(length=32), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("gpu_indices", sa.JSON(), nullable=False),
        sa.Column("generation", sa.String(length=48), nullable=True),
        sa.Column("stop_requested", sa.Boolean(), nullable=False),
        sa.Column("log_bytes", sa.BigInteger(), nullable=False),
        sa.Column("log_complete", sa.Boolean(), nullable=False),
        sa.Column("reported_at", TS, nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"]),
        sa.ForeignKeyConstraint(["node_id"], ["nodes.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_job_workers_node_id"), "job_workers", ["node_id"], unique=False)
    op.create_index("uq_job_workers_job_index", "job_workers", ["job_id", "index"], unique=True)


def downgrade() -> None:
    op.drop_index("uq_job_workers_job_index", table_name="job_workers")
    op.drop_index(op.f("ix_job_workers_node_id"), table_name="job_workers")
    op.drop_table("job_workers")
    op.drop_index("uq_job_log_chunks_offset", table_name="job_log_chunks")
    op.drop_table("job_log_chunks")
    for index in ("state", "region_id", "project_id", "node_id", "account_id"):
        op.drop_index(op.f(f"ix_jobs_{index}"), table_name="jobs")
    op.drop_index("ix_jobs_account_name", table_name="jobs")
    op.drop_table("jobs")
