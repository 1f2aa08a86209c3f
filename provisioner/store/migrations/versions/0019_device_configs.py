"""device configurations and deploys: configurations per region with their revisions (keys sealed), the
configuration and deploy of each device with what its minion reports, and the inference containers' logs

Revision ID: 0019_device_configs
Revises: 0018_gcp_burst
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019_device_configs"
down_revision = "0018_gcp_burst"
branch_labels = None
depends_on = None
TS = sa.DateTime(timezone=True)
NOT_REMOVED = sa.text("state != 'removed'")


def upgrade() -> None:
    op.create_table(
        "device_configs",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("region_id", sa.String(length=32), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("latest_revision", sa.Integer(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["region_id"], ["regions.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_device_configs_region_id"), "device_configs", ["region_id"], unique=False)
    op.create_index(
        "uq_device_configs_region_name_live",
        "device_configs",
        ["region_id", "name"],
        unique=True,
        sqlite_where=NOT_REMOVED,
        postgresql_where=NOT_REMOVED,
    )
    op.create_table(
        "device_config_revisions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("config_id", sa.String(length=32), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("sealed_keys", sa.Text(), nullable=True),
        sa.Column("created_by", sa.String(length=128), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.ForeignKeyConstraint(["config_id"], ["device_configs.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "uq_device_config_revisions_config_revision",
        "device_config_revisions",
        ["config_id", "revision"],
        unique=True,
    )
    op.create_table(
        "device_deployments",
        sa.Column("node_id", sa.String(length=32), nullable=False),
        sa.Column("config_id", sa.String(length=32), nullable=True),
        sa.Column("revision", sa.Integer(), nullable=True),
        sa.Column("deployed_revision", sa.Integer(), nullable=True),
        sa.Column("generation", sa.String(length=48), nullable=True),
        sa.Column("deploys", sa.Integer(), nullable=False),
        sa.Column("deployed_at", TS, nullable=True),
        sa.Column("inference_state", sa.String(length=16), nullable=True),
        sa.Column("inference_message", sa.Text(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("last_lines", sa.Text(), nullable=True),
        sa.Column("reported_generation", sa.String(length=64), nullable=True),
        sa.Column("reported_at", TS, nullable=True),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["config_id"], ["device_configs.id"]),
        sa.ForeignKeyConstraint(["node_id"], ["nodes.id"]),
        sa.PrimaryKeyConstraint("node_id"),
    )
    op.create_index(
        op.f("ix_device_deployments_config_id"), "device_deployments", ["config_id"], unique=False
    )
    op.create_table(
        "device_log_chunks",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("node_id", sa.String(length=32), nullable=False),
        sa.Column("generation", sa.String(length=64), nullable=False),
        sa.Column("offset", sa.BigInteger(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
        sa.Column("eof", sa.Boolean(), nullable=False),
        sa.Column("at", TS, nullable=False),
        sa.ForeignKeyConstraint(["node_id"], ["nodes.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "uq_device_log_chunks_offset", "device_log_chunks", ["node_id", "generation", "offset"], unique=True
    )


def downgrade() -> None:
    op.drop_index("uq_device_log_chunks_offset", table_name="device_log_chunks")
    op.drop_table("device_log_chunks")
    op.drop_index(op.f("ix_device_deployments_config_id"), table_name="device_deployments")
    op.drop_table("device_deployments")
    op.drop_index("uq_device_config_revisions_config_revision", table_name="device_config_revisions")
    op.drop_table("device_config_revisions")
    op.drop_index("uq_device_configs_region_name_live", table_name="device_configs")
    op.drop_index(op.f("ix_device_configs_region_id"), table_name="device_configs")
    op.drop_table("device_configs")
