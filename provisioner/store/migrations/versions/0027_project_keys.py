"""project_keys: a project's third-party keys (a private registry's credentials first), the secret half
sealed.

Revision ID: 0027_project_keys
Revises: 0026_tenancy
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0027_project_keys"
down_revision = "0026_tenancy"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "project_keys",
        sa.Column("id", sa.String(length=32), primary_key=True),
        sa.Column("project_id", sa.String(length=32), sa.ForeignKey("projects.id"), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("name", sa.String(length=253), nullable=False),
        sa.Column("key_id", sa.String(length=256), nullable=False),
        sa.Column("sealed_secret", sa.Text(), nullable=False),
        sa.Column("created_by", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("project_id", "kind", "name", name="uq_project_keys_project_kind_name"),
    )
    op.create_index("ix_project_keys_project_id", "project_keys", ["project_id"])


def downgrade() -> None:
    op.drop_index("ix_project_keys_project_id", table_name="project_keys")
    op.drop_table("project_keys")
