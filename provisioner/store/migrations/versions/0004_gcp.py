"""gcp: provider bootstrap state, storage nodes

Revision ID: 0004_gcp
Revises: 0003_regional
"""

from __future__ import annotations

import sqlalchemy as sa  # noqa: F401
from alembic import op  # noqa: F401

revision = '0004_gcp'
down_revision = '0003_regional'
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass  # filled by the work that owns this revision


def downgrade() -> None:
    pass
