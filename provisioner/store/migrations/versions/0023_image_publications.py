"""image_publications: a registered manifest's GCE target published to a provider's project
(`provision image publish`, docs/gcp.md "The rigbase image on GCE")

Revision ID: 0023_image_publications
Revises: 0022_device_key_identity
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023_image_publications"
down_revision = "0022_device_key_identity"
branch_labels = None
depends_on = None
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "image_publications",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("manifest_id", sa.String(length=32), nullable=False),
        sa.Column("provider_id", sa.String(length=32), nullable=False),
        sa.Column("target", sa.String(length=16), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("bucket", sa.String(length=222), nullable=False),
        sa.Column("object_name", sa.String(length=1024), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("crc32c", sa.String(length=16), nullable=False),
        sa.Column("upload_url", sa.Text(), nullable=True),
        sa.Column("image_name", sa.String(length=63), nullable=False),
        sa.Column("family", sa.String(length=63), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("created_by", sa.String(length=128), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.ForeignKeyConstraint(["manifest_id"], ["image_manifests.id"]),
        sa.ForeignKeyConstraint(["provider_id"], ["providers.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint(
            "manifest_id", "provider_id", "target", name="uq_image_publications_manifest_provider_target"
        ),
    )
    op.create_index("ix_image_publications_manifest_id", "image_publications", ["manifest_id"])
    op.create_index("ix_image_publications_provider_id", "image_publications", ["provider_id"])


def downgrade() -> None:
    op.drop_index("ix_image_publications_provider_id", table_name="image_publications")
    op.drop_index("ix_image_publications_manifest_id", table_name="image_publications")
    op.drop_table("image_publications")
