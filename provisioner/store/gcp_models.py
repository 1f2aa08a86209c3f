"""Store models: GCP provider bootstrap and storage-node records."""

from __future__ import annotations

from provisioner.store.models import Base  # noqa: F401
