"""foundation: providers, regions, nodes, audit trail, api tokens

Revision ID: 0001_foundation
Revises:
Create Date: 2026-11-21 11:57:33.629123
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_foundation"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table(
        "api_tokens",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("token_sha256", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name"),
        sa.UniqueConstraint("token_sha256"),
    )
    op.create_table(
        "audit_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("resource_kind", sa.String(length=32), nullable=False),
        sa.Column("resource_id", sa.String(length=32), nullable=False),
        sa.Column("resource_name", sa.String(length=128), nullable=False),
        sa.Column("from_state", sa.String(length=16), nullable=True),
        sa.Column("to_state", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("audit_events", schema=None) as batch_op:
        batch_op.create_index("ix_audit_resource", ["resource_kind", "resource_id", "id"], unique=False)

    op.create_table(
        "providers",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("payment_mode", sa.String(length=32), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("public_config", sa.JSON(), nullable=False),
        sa.Column("sealed_config", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("providers", schema=None) as batch_op:
        batch_op.create_index(
            "uq_providers_kind_live",
            ["kind"],
            unique=True,
            sqlite_where=sa.text("state != 'removed'"),
            postgresql_where=sa.text("state != 'removed'"),
        )

    op.create_table(
        "regions",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("provider_id", sa.String(length=32), nullable=False),
        sa.Column("storage_mode", sa.String(length=16), nullable=False),
        sa.Column("public_jobs", sa.Boolean(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("settings", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["provider_id"],
            ["providers.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("regions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_regions_name"), ["name"], unique=False)
        batch_op.create_index(
            "uq_regions_provider_name_live",
            ["provider_id", "name"],
            unique=True,
            sqlite_where=sa.text("state != 'removed'"),
            postgresql_where=sa.text("state != 'removed'"),
        )

    op.create_table(
        "nodes",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("region_id", sa.String(length=32), nullable=False),
        sa.Column("minion_id", sa.String(length=32), nullable=False),
        sa.Column("service", sa.String(length=16), nullable=False),
        sa.Column("hostname", sa.String(length=253), nullable=True),
        sa.Column("upnp", sa.Boolean(), nullable=False),
        sa.Column("mining", sa.Boolean(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("inventory", sa.JSON(), nullable=True),
        sa.Column("requirements", sa.JSON(), nullable=True),
        sa.Column("last_heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["region_id"],
            ["regions.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_nodes_minion_id"), ["minion_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_nodes_name"), ["name"], unique=False)
        batch_op.create_index(batch_op.f("ix_nodes_region_id"), ["region_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_nodes_state"), ["state"], unique=False)
        batch_op.create_index(
            "uq_nodes_minion_id_live",
            ["minion_id"],
            unique=True,
            sqlite_where=sa.text("state != 'removed'"),
            postgresql_where=sa.text("state != 'removed'"),
        )
        batch_op.create_index(
            "uq_nodes_region_name_live",
            ["region_id", "name"],
            unique=True,
            sqlite_where=sa.text("state != 'removed'"),
            postgresql_where=sa.text("state != 'removed'"),
        )
        batch_op.create_index(
            "uq_nodes_region_storage_live",
            ["region_id"],
            unique=True,
            sqlite_where=sa.text("service = 'storage' AND state != 'removed'"),
            postgresql_where=sa.text("service = 'storage' AND state != 'removed'"),
        )


def downgrade() -> None:

    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_index(
            "uq_nodes_region_storage_live",
            sqlite_where=sa.text("service = 'storage' AND state != 'removed'"),
            postgresql_where=sa.text("service = 'storage' AND state != 'removed'"),
        )
        batch_op.drop_index(
            "uq_nodes_region_name_live",
            sqlite_where=sa.text("state != 'removed'"),
            postgresql_where=sa.text("state != 'removed'"),
        )
        batch_op.drop_index(
            "uq_nodes_minion_id_live",
            sqlite_where=sa.text("state != 'removed'"),
            postgresql_where=sa.text("state != 'removed'"),
        )
        batch_op.drop_index(batch_op.f("ix_nodes_state"))
        batch_op.drop_index(batch_op.f("ix_nodes_region_id"))
        batch_op.drop_index(batch_op.f("ix_nodes_name"))
        batch_op.drop_index(batch_op.f("ix_nodes_minion_id"))

    op.drop_table("nodes")
    with op.batch_alter_table("regions", schema=None) as batch_op:
        batch_op.drop_index(
            "uq_regions_provider_name_live",
            sqlite_where=sa.text("state != 'removed'"),
            postgresql_where=sa.text("state != 'removed'"),
        )
        batch_op.drop_index(batch_op.f("ix_regions_name"))

    op.drop_table("regions")
    with op.batch_alter_table("providers", schema=None) as batch_op:
        batch_op.drop_index(
            "uq_providers_kind_live",
            sqlite_where=sa.text("state != 'removed'"),
            postgresql_where=sa.text("state != 'removed'"),
        )

    op.drop_table("providers")
    with op.batch_alter_table("audit_events", schema=None) as batch_op:
        batch_op.drop_index("ix_audit_resource")

    op.drop_table("audit_events")
    op.drop_table("api_tokens")
