"""billing: device-day fees and federated jobs. The daily device fee asks each pass for every account's
newest charged day (rule, payer, max(day)): an index on exactly that, so the question reads the device
entries only, not the whole ledger, every minute

Revision ID: 0020_billing_devices
Revises: 0019_device_configs
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020_billing_devices"
down_revision = "0019_device_configs"
branch_labels = None
depends_on = None
DAY_SET = sa.text("day IS NOT NULL")


def upgrade() -> None:
    # partial: only the entries of a day (device fees, transfers); a metering tick's job-hour entries,
    # thousands at once, have none and skip it
    op.create_index(
        "ix_ledger_entries_rule_payer_day",
        "ledger_entries",
        ["rule", "payer", "day"],
        postgresql_where=DAY_SET,
        sqlite_where=DAY_SET,
    )


def downgrade() -> None:
    op.drop_index("ix_ledger_entries_rule_payer_day", table_name="ledger_entries")
