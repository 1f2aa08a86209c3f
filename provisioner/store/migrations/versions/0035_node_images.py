"""nodes.images: what a node tells of its images (contracts.jobs.NodeImages: its `localhost/` images and
how its last pull from each registry went), which `job create --dry-run` warns from; null until its minion
tells.

Revision ID: 0035_node_images
Revises: 0034_project_notebook_autostop
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0035_node_images"
down_revision = "0034_project_notebook_autostop"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("nodes", sa.Column("images", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("nodes", "images")
