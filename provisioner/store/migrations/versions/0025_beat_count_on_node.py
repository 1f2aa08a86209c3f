"""nodes.heartbeats: the beat counter moves from node_attestations onto the node row, so a steady heartbeat
writes one row (the node's report and its count) instead of two. The quote schedule and its grace still count
beats: `node_attestations.quote_asked_beat` now compares with `nodes.heartbeats`.

Revision ID: 0025_beat_count_on_node
Revises: 0024_gcp_permanent_compute
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0025_beat_count_on_node"
down_revision = "0024_gcp_permanent_compute"
branch_labels = None
depends_on = None

_COPY_TO_NODES = (
    "UPDATE nodes SET heartbeats = (SELECT a.heartbeats FROM node_attestations a WHERE a.node_id = nodes.id) "
    "WHERE EXISTS (SELECT 1 FROM node_attestations a WHERE a.node_id = nodes.id AND a.heartbeats IS NOT NULL)"
)
_COPY_TO_ATTESTATIONS = (
    "UPDATE node_attestations SET heartbeats = "
    "(SELECT n.heartbeats FROM nodes n WHERE n.id = node_attestations.node_id) "
    "WHERE node_id IS NOT NULL"
)


# Plain ALTER TABLE, not batch mode: both stores add and drop a column in place (SQLite since 3.35).
# Batch mode would copy `nodes` into a new table and drop the old one, which SQLite refuses while other
# rows refer to it and foreign keys are enforced, as they are on every rigbase connection.


def upgrade() -> None:
    op.add_column("nodes", sa.Column("heartbeats", sa.Integer(), nullable=False, server_default="0"))
    op.execute(_COPY_TO_NODES)
    op.drop_column("node_attestations", "heartbeats")


def downgrade() -> None:
    op.add_column("node_attestations", sa.Column("heartbeats", sa.Integer(), nullable=True))
    op.execute(_COPY_TO_ATTESTATIONS)
    op.drop_column("nodes", "heartbeats")
