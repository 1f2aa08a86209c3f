"""images: trusted builder keys and registered image manifests

Revision ID: 0005_images
Revises: 0004_gcp
"""

from __future__ import annotations

import sqlalchemy as sa  # noqa: F401
from alembic import op  # noqa: F401

revision = '0005_images'
down_revision = '0004_gcp'
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass  # filled by the work that owns this revision


def downgrade() -> None:
    pass
