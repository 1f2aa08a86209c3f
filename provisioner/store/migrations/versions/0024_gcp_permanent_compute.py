"""gcp_burst_vms: permanent GCP compute nodes (`provision node add NAME --region R --gpu-type T`) are rows
without a job (job_id NULL) that live until their node is removed; `reservation` names the Compute
reservation (committed capacity) the VM consumes

Revision ID: 0024_gcp_permanent_compute
Revises: 0023_image_publications
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0024_gcp_permanent_compute"
down_revision = "0023_image_publications"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("gcp_burst_vms", schema=None) as batch_op:
        batch_op.alter_column("job_id", existing_type=sa.String(length=32), nullable=True)
        batch_op.add_column(sa.Column("reservation", sa.String(length=63), nullable=True))


def downgrade() -> None:
    op.execute("DELETE FROM gcp_burst_vms WHERE job_id IS NULL")
    with op.batch_alter_table("gcp_burst_vms", schema=None) as batch_op:
        batch_op.drop_column("reservation")
        batch_op.alter_column("job_id", existing_type=sa.String(length=32), nullable=False)
