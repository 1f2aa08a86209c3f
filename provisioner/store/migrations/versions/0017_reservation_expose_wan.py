"""reservations: expose_wan, the per-reservation opt-in to a router (UPnP) mapping; existing reservations
become LAN-only (false), the safe default (docs/reservations.md "LAN-only by default"); reported_by, the
node a reservation's actual state came from (a job's reservation moves with the job)

Revision ID: 0017_reservation_expose_wan
Revises: 0016_billing
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017_reservation_expose_wan"
down_revision = "0016_billing"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("reservations", schema=None) as batch_op:
        batch_op.add_column(sa.Column("expose_wan", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch_op.add_column(sa.Column("reported_by", sa.String(length=32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("reservations", schema=None) as batch_op:
        batch_op.drop_column("reported_by")
        batch_op.drop_column("expose_wan")
