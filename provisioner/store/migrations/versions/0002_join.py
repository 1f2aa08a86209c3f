"""join: join tokens, trusted TPM CAs, pending minions, node credentials, PCR records

Revision ID: 0002_join
Revises: 0001_foundation
"""

from __future__ import annotations

import sqlalchemy as sa  # noqa: F401
from alembic import op  # noqa: F401

revision = '0002_join'
down_revision = '0001_foundation'
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass  # filled by the work that owns this revision


def downgrade() -> None:
    pass
