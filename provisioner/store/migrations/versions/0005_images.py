"""images: trusted builder keys and registered image manifests

Revision ID: 0005_images
Revises: 0004_gcp
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_images"
down_revision = "0004_gcp"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "image_keys",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("public_key", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_by", sa.String(length=128), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("fingerprint"),
    )
    op.create_table(
        "image_manifests",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("region_id", sa.String(length=32), nullable=False),
        sa.Column("key_id", sa.String(length=32), nullable=False),
        sa.Column("manifest_sha256", sa.String(length=64), nullable=False),
        sa.Column("manifest", sa.Text(), nullable=False),
        sa.Column("signature", sa.Text(), nullable=False),
        sa.Column("image_sha256", sa.String(length=64), nullable=False),
        sa.Column("uki_sha256", sa.String(length=64), nullable=False),
        sa.Column("verity_root_hash", sa.String(length=128), nullable=False),
        sa.Column("pcr11", sa.String(length=64), nullable=False),
        sa.Column("pcr12", sa.String(length=64), nullable=False),
        sa.Column("pcr4", sa.String(length=64), nullable=True),
        sa.Column("pin_pcr4", sa.Boolean(), nullable=False),
        sa.Column("packages", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_by", sa.String(length=128), nullable=False),
        sa.ForeignKeyConstraint(["key_id"], ["image_keys.id"]),
        sa.ForeignKeyConstraint(["region_id"], ["regions.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("region_id", "manifest_sha256", name="uq_image_manifests_region_sha"),
    )
    with op.batch_alter_table("image_manifests", schema=None) as batch_op:
        batch_op.create_index("ix_image_manifests_key_id", ["key_id"], unique=False)
        batch_op.create_index("ix_image_manifests_region_id", ["region_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("image_manifests", schema=None) as batch_op:
        batch_op.drop_index("ix_image_manifests_region_id")
        batch_op.drop_index("ix_image_manifests_key_id")
    op.drop_table("image_manifests")
    op.drop_table("image_keys")
