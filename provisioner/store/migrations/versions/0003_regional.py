"""regional resources: reservations and datastores

Revision ID: 0003_regional
Revises: 0002_join
"""

from __future__ import annotations

import sqlalchemy as sa  # noqa: F401
from alembic import op  # noqa: F401

revision = '0003_regional'
down_revision = '0002_join'
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass  # filled by the work that owns this revision


def downgrade() -> None:
    pass
