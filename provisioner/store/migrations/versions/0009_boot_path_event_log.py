"""boot path from the event log: image manifests keep their pe_hashes; --pin-pcr4 goes away

Revision ID: 0009_boot_path_event_log
Revises: 0008_finalize_on_node
"""

from __future__ import annotations

import base64
import json
import re

import sqlalchemy as sa
from alembic import op

revision = "0009_boot_path_event_log"
down_revision = "0008_finalize_on_node"
branch_labels = None
depends_on = None

_HEX64 = re.compile(r"[0-9a-f]{64}")


def _pe_hashes(manifest: str) -> list[str]:
    """The digests a registered manifest names (the same reading as provisioner/services/fleet/images.py)."""
    raw = base64.b64decode(manifest[7:]) if manifest.startswith("base64:") else manifest.encode()
    try:
        found = json.loads(raw).get("pe_hashes")
    except (ValueError, AttributeError):
        return []
    values = found.values() if isinstance(found, dict) else []
    return sorted({v for v in values if isinstance(v, str) and _HEX64.fullmatch(v)})


def upgrade() -> None:
    with op.batch_alter_table("image_manifests", schema=None) as batch_op:
        batch_op.add_column(sa.Column("pe_hashes", sa.JSON(), nullable=True))
    table = sa.table(
        "image_manifests",
        sa.column("id", sa.String()),
        sa.column("manifest", sa.Text()),
        sa.column("pe_hashes", sa.JSON()),
    )
    bind = op.get_bind()
    for row_id, manifest in bind.execute(sa.select(table.c.id, table.c.manifest)).all():
        bind.execute(table.update().where(table.c.id == row_id).values(pe_hashes=_pe_hashes(manifest)))
    with op.batch_alter_table("image_manifests", schema=None) as batch_op:
        batch_op.drop_column("pin_pcr4")


def downgrade() -> None:
    with op.batch_alter_table("image_manifests", schema=None) as batch_op:
        batch_op.add_column(sa.Column("pin_pcr4", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch_op.drop_column("pe_hashes")
