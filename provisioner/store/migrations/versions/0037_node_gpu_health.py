"""nodes.gpu_health: what a node's NVML says of its GPUs (contracts.gpu_health.GpuHealthReport), which
placement reads (only `ok` GPUs are offered; a failed one takes the node out) and `node show` shows; null
until its minion tells.

Revision ID: 0037_node_gpu_health
Revises: 0036_relay_peers
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0037_node_gpu_health"
down_revision = "0036_relay_peers"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("nodes", sa.Column("gpu_health", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("nodes", "gpu_health")
