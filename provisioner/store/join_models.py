"""Store models: join tokens, trusted TPM vendor CAs, pending minions, node credentials, PCR records."""

from __future__ import annotations

from provisioner.store.models import Base  # noqa: F401
