"""job_workers: each worker's group, its resources, its peer port, its GPU type and locked price, and its
own start (worker groups, gang and independent jobs, billing per worker). Existing workers are filled from
their job: the one group "worker", the job's GPU count, type, price and start.

Revision ID: 0030_worker_groups
Revises: 0029_bundle_tokens
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0030_worker_groups"
down_revision = "0029_bundle_tokens"
branch_labels = None
depends_on = None

COLUMNS = (
    sa.Column("group_name", sa.String(63), nullable=False, server_default="worker"),
    sa.Column("group_index", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("gpu_count", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("cpu_count", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("port", sa.Integer(), nullable=True),
    sa.Column("gpu_type", sa.String(64), nullable=True),
    sa.Column("price_per_gpu_hour", sa.Float(), nullable=True),
    sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
)


def upgrade() -> None:
    for column in COLUMNS:
        op.add_column("job_workers", column)
    bind = op.get_bind()
    jobs = sa.table(
        "jobs",
        sa.column("id", sa.String),
        sa.column("spec", sa.JSON),
        sa.column("gpu_type", sa.String),
        sa.column("price_per_gpu_hour", sa.Float),
        sa.column("started_at", sa.DateTime(timezone=True)),
    )
    workers = sa.table(
        "job_workers",
        sa.column("job_id", sa.String),
        sa.column("index", sa.Integer),
        sa.column("group_index", sa.Integer),
        sa.column("gpu_count", sa.Integer),
        sa.column("cpu_count", sa.Integer),
        sa.column("gpu_type", sa.String),
        sa.column("price_per_gpu_hour", sa.Float),
        sa.column("started_at", sa.DateTime(timezone=True)),
    )
    for job in bind.execute(sa.select(jobs)).mappings():
        resources = (job["spec"] or {}).get("resources") or {}
        gpus = int(resources.get("gpu_count") or 0)
        bind.execute(
            workers.update()
            .where(workers.c.job_id == job["id"])
            .values(
                group_index=workers.c.index,
                gpu_count=gpus,
                cpu_count=0 if gpus else int(resources.get("cpu_count") or 0),
                gpu_type=job["gpu_type"],
                price_per_gpu_hour=job["price_per_gpu_hour"],
                started_at=job["started_at"],
            )
        )


def downgrade() -> None:
    for column in reversed(COLUMNS):
        op.drop_column("job_workers", column.name)
