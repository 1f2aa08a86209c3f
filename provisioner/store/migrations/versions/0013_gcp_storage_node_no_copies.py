"""gcp_storage_nodes keeps no copies: the VM's name is its node's name, the GCP region is the region's
setting `gcp_region`

Revision ID: 0013_gcp_storage_node_no_copies
Revises: 0012_drop_lab_root
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013_gcp_storage_node_no_copies"
down_revision = "0012_drop_lab_root"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("gcp_storage_nodes", schema=None) as batch_op:
        batch_op.drop_column("instance_name")
        batch_op.drop_column("gcp_region")


def downgrade() -> None:
    with op.batch_alter_table("gcp_storage_nodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("gcp_region", sa.String(length=63), nullable=True))
        batch_op.add_column(sa.Column("instance_name", sa.String(length=63), nullable=True))
    # refill the copies from where the data lives
    op.execute(
        "UPDATE gcp_storage_nodes SET instance_name = (SELECT name FROM nodes WHERE nodes.id = "
        "gcp_storage_nodes.node_id)"
    )
