"""gcp: provider bootstrap state, storage nodes

Revision ID: 0004_gcp
Revises: 0003_regional
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_gcp"
down_revision = "0003_regional"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gcp_storage_nodes",
        sa.Column("region_id", sa.String(length=32), nullable=False),
        sa.Column("node_id", sa.String(length=32), nullable=False),
        sa.Column("instance_name", sa.String(length=63), nullable=False),
        sa.Column("gcp_region", sa.String(length=63), nullable=False),
        sa.Column("zone", sa.String(length=63), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("running", sa.Boolean(), nullable=False),
        sa.Column("progress", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("sealed_join_token", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["node_id"], ["nodes.id"]),
        sa.ForeignKeyConstraint(["region_id"], ["regions.id"]),
        sa.PrimaryKeyConstraint("region_id"),
    )
    with op.batch_alter_table("gcp_storage_nodes", schema=None) as batch_op:
        batch_op.create_index("ix_gcp_storage_nodes_node_id", ["node_id"], unique=False)
        batch_op.create_index("ix_gcp_storage_nodes_status", ["status"], unique=False)
    op.create_table(
        "gcp_bootstraps",
        sa.Column("provider_id", sa.String(length=32), nullable=False),
        sa.Column("progress", sa.Text(), nullable=True),
        sa.Column("created", sa.JSON(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["provider_id"], ["providers.id"]),
        sa.PrimaryKeyConstraint("provider_id"),
    )


def downgrade() -> None:
    op.drop_table("gcp_bootstraps")
    with op.batch_alter_table("gcp_storage_nodes", schema=None) as batch_op:
        batch_op.drop_index("ix_gcp_storage_nodes_status")
        batch_op.drop_index("ix_gcp_storage_nodes_node_id")
    op.drop_table("gcp_storage_nodes")
