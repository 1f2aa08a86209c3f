"""accounts and projects: every operator token and region belongs to an account

Creates the root account `default` with its default project `default` (on a new store as on an old one)
and gives it every existing operator token and region.

Revision ID: 0014_accounts_projects
Revises: 0013_gcp_storage_node_no_copies
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision = "0014_accounts_projects"
down_revision = "0013_gcp_storage_node_no_copies"
branch_labels = None
depends_on = None
TS = sa.DateTime(timezone=True)
PROJECT_LIVE = sa.text("removed_at IS NULL")
DEFAULT_PROJECT_LIVE = sa.text("is_default AND removed_at IS NULL")
ROOT_ACCOUNT = "default"
DEFAULT_PROJECT = "default"


def upgrade() -> None:
    op.create_table(
        "accounts",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("root", sa.Boolean(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name"),
    )
    op.create_table(
        "projects",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("account_id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("is_default", sa.Boolean(), nullable=False),
        sa.Column("description", sa.String(length=200), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("removed_at", TS, nullable=True),
        sa.ForeignKeyConstraint(["account_id"], ["accounts.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("projects", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_projects_account_id"), ["account_id"], unique=False)
        batch_op.create_index(
            "uq_projects_account_name_live",
            ["account_id", "name"],
            unique=True,
            sqlite_where=PROJECT_LIVE,
            postgresql_where=PROJECT_LIVE,
        )
        batch_op.create_index(
            "uq_projects_account_default_live",
            ["account_id"],
            unique=True,
            sqlite_where=DEFAULT_PROJECT_LIVE,
            postgresql_where=DEFAULT_PROJECT_LIVE,
        )

    # the root account and its default project: what every existing token and region moves to
    now = datetime.now(UTC)
    account_id = f"acc_{secrets.token_hex(8)}"
    accounts = sa.table(
        "accounts",
        sa.column("id", sa.String),
        sa.column("name", sa.String),
        sa.column("root", sa.Boolean),
        sa.column("created_at", TS),
    )
    projects = sa.table(
        "projects",
        sa.column("id", sa.String),
        sa.column("account_id", sa.String),
        sa.column("name", sa.String),
        sa.column("is_default", sa.Boolean),
        sa.column("created_at", TS),
    )
    op.execute(accounts.insert().values(id=account_id, name=ROOT_ACCOUNT, root=True, created_at=now))
    op.execute(
        projects.insert().values(
            id=f"prj_{secrets.token_hex(8)}",
            account_id=account_id,
            name=DEFAULT_PROJECT,
            is_default=True,
            created_at=now,
        )
    )

    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.add_column(sa.Column("account_id", sa.String(length=32), nullable=True))
    op.execute(sa.text("UPDATE api_tokens SET account_id = :a").bindparams(a=account_id))
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.alter_column("account_id", existing_type=sa.String(length=32), nullable=False)
        batch_op.create_index(batch_op.f("ix_api_tokens_account_id"), ["account_id"], unique=False)
        batch_op.create_foreign_key("fk_api_tokens_account_id", "accounts", ["account_id"], ["id"])

    with op.batch_alter_table("regions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("account_id", sa.String(length=32), nullable=True))
    op.execute(sa.text("UPDATE regions SET account_id = :a").bindparams(a=account_id))
    with op.batch_alter_table("regions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_regions_account_id"), ["account_id"], unique=False)
        batch_op.create_foreign_key("fk_regions_account_id", "accounts", ["account_id"], ["id"])


def downgrade() -> None:
    with op.batch_alter_table("regions", schema=None) as batch_op:
        batch_op.drop_constraint("fk_regions_account_id", type_="foreignkey")
        batch_op.drop_index(batch_op.f("ix_regions_account_id"))
        batch_op.drop_column("account_id")
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.drop_constraint("fk_api_tokens_account_id", type_="foreignkey")
        batch_op.drop_index(batch_op.f("ix_api_tokens_account_id"))
        batch_op.drop_column("account_id")
    with op.batch_alter_table("projects", schema=None) as batch_op:
        batch_op.drop_index("uq_projects_account_default_live")
        batch_op.drop_index("uq_projects_account_name_live")
        batch_op.drop_index(batch_op.f("ix_projects_account_id"))
    op.drop_table("projects")
    op.drop_table("accounts")
