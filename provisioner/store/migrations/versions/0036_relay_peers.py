"""relay_peers: the `provision serve` processes of a deployment's hosts that relay node tunnels to each
other (api/tunnel_relay.py): each one's relay tag, its URL and when it last said it lives.

Revision ID: 0036_relay_peers
Revises: 0035_node_images
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0036_relay_peers"
down_revision = "0035_node_images"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "relay_peers",
        sa.Column("tag", sa.String(16), primary_key=True),
        sa.Column("url", sa.String(300), nullable=False),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_relay_peers_seen_at", "relay_peers", ["seen_at"])


def downgrade() -> None:
    op.drop_index("ix_relay_peers_seen_at", "relay_peers")
    op.drop_table("relay_peers")
