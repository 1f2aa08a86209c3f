"""regional resources: reservations and datastores

Revision ID: 0003_regional
Revises: 0002_join
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_regional"
down_revision = "0002_join"
branch_labels = None
depends_on = None

LIVE = sa.text("state != 'removed'")


def upgrade() -> None:
    op.create_table(
        "reservations",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("region_id", sa.String(length=32), nullable=False),
        sa.Column("hostname", sa.String(length=63), nullable=False),
        sa.Column("port", sa.Integer(), nullable=False),
        sa.Column("protocol", sa.String(length=8), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("node_id", sa.String(length=32), nullable=True),
        sa.Column("actual_state", sa.String(length=16), nullable=True),
        sa.Column("actual_reason", sa.Text(), nullable=True),
        sa.Column("address", sa.String(length=64), nullable=True),
        sa.Column("external_address", sa.String(length=80), nullable=True),
        sa.Column("mdns", sa.String(length=24), nullable=True),
        sa.Column("upnp", sa.String(length=24), nullable=True),
        sa.Column("reported_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["node_id"],
            ["nodes.id"],
        ),
        sa.ForeignKeyConstraint(
            ["region_id"],
            ["regions.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("reservations", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_reservations_node_id"), ["node_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_reservations_region_id"), ["region_id"], unique=False)
        for column in ("name", "hostname", "port"):
            batch_op.create_index(
                f"uq_reservations_region_{column}_live",
                ["region_id", column],
                unique=True,
                sqlite_where=LIVE,
                postgresql_where=LIVE,
            )

    op.create_table(
        "datastores",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("region_id", sa.String(length=32), nullable=False),
        sa.Column("type", sa.String(length=8), nullable=False),
        sa.Column("address", sa.String(length=253), nullable=False),
        sa.Column("root", sa.Text(), nullable=False),
        sa.Column("username", sa.String(length=256), nullable=True),
        sa.Column("sealed_password", sa.Text(), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["region_id"],
            ["regions.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("datastores", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_datastores_region_id"), ["region_id"], unique=False)
        batch_op.create_index(
            "uq_datastores_region_name_live",
            ["region_id", "name"],
            unique=True,
            sqlite_where=LIVE,
            postgresql_where=LIVE,
        )


def downgrade() -> None:
    op.drop_table("datastores")
    op.drop_table("reservations")
