"""Store models: reservations and datastores."""

from __future__ import annotations

from provisioner.store.models import Base  # noqa: F401
