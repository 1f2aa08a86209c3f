"""node_attestations.identity, pending_minions.identity: what a minion proved itself with — `tpm` (its
EK and AK; every row so far) or `device-key` (a device without a TPM, docs/join-protocol.md "Devices
without a TPM"); for a device key, ak_public holds the key's SubjectPublicKeyInfo

Revision ID: 0022_device_key_identity
Revises: 0021_project_shares
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022_device_key_identity"
down_revision = "0021_project_shares"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for table in ("node_attestations", "pending_minions"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(
                sa.Column("identity", sa.String(length=16), nullable=False, server_default="tpm")
            )


def downgrade() -> None:
    for table in ("pending_minions", "node_attestations"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column("identity")
