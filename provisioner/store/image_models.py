"""Store models: trusted image-builder keys and registered image manifests."""

from __future__ import annotations

from provisioner.store.models import Base  # noqa: F401
