"""The complete schema: every model module imported, so `metadata` holds every table. Alembic's
env.py and the schema test read it. A new model module (e.g. join tokens, pending minions) is one
import line here, plus an Alembic revision in migrations/versions/ (down_revision = the current head)."""

from __future__ import annotations

from provisioner.store import models  # noqa: F401  (registers its tables on Base.metadata)
from provisioner.store.models import Base

metadata = Base.metadata
from provisioner.store import (  # noqa: F401,E402
    account_models,
    billing_models,
    data_models,
    device_models,
    gcp_models,
    image_models,
    job_models,
    join_models,
    regional_models,
)
