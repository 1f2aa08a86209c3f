"""projects.notebook_autostop_minutes: a project's own default autostop for its notebooks (docs/job-urls.md,
"Autostop"); null keeps the built-in one hour.

Revision ID: 0034_project_notebook_autostop
Revises: 0033_worker_idle_since
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0034_project_notebook_autostop"
down_revision = "0033_worker_idle_since"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("projects", sa.Column("notebook_autostop_minutes", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("projects", "notebook_autostop_minutes")
