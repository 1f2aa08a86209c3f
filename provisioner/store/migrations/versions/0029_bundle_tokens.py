"""join_tokens.sealed_token: a bundle's join token kept sealed, so the region's next bundle carries the
same live token (tokens issued before this revision are not reused: only their SHA-256 was kept).

Revision ID: 0029_bundle_tokens
Revises: 0028_job_metrics
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0029_bundle_tokens"
down_revision = "0028_job_metrics"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("join_tokens", sa.Column("sealed_token", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("join_tokens", "sealed_token")
