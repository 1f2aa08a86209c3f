"""nodes.object_cache: what a node's object cache last reported (contracts/object_cache.ObjectsActual):
the digests it holds whole, its bytes and budget, what it fetches and what waits for room. Placement reads
it to prefer a node or region that holds a job's data; a central region's workers start once its storage
node holds theirs.

Revision ID: 0032_node_object_cache
Revises: 0031_data_objects
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0032_node_object_cache"
down_revision = "0031_data_objects"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("nodes", sa.Column("object_cache", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("nodes", "object_cache")
