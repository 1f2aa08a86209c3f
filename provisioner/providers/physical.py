"""The physical provider: the operator's own servers. Nothing to create in anyone's account;
regions carry a storage mode (local | central) and whether spare capacity is sold (public jobs).
Payment is in credits (docs/product-rules.md "Public-job credits": (price − usage fee) ÷ 2)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from contracts.errors import InvalidInput
from contracts.regional import StorageMode
from provisioner.providers.base import ProviderConfig, ProviderDriver


class PhysicalProvider(ProviderDriver):
    kind: ClassVar[str] = "physical"
    title: ClassVar[str] = "Physical servers"
    payment_modes: ClassVar[tuple[str, ...]] = ("credits",)

    def validate_config(self, raw: Mapping[str, Any]) -> ProviderConfig:
        unknown = sorted(set(raw) - {"payment_mode"})
        if unknown:
            raise InvalidInput(
                f"physical provider takes no option {', '.join(unknown)}: enable it with no options"
            )
        return ProviderConfig(payment_mode=str(raw.get("payment_mode", "credits")))

    def validate_region(self, name: str, options: Mapping[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(options) - {"storage_mode", "public_jobs"})
        if unknown:
            raise InvalidInput(
                f"physical regions take no option {', '.join(unknown)}: "
                "use --storage-mode and --public-jobs/--no-public-jobs"
            )
        mode = options.get("storage_mode", StorageMode.LOCAL.value)
        if mode not in {m.value for m in StorageMode}:
            raise InvalidInput(f"storage mode '{mode}' is not known: use local or central")
        # the region columns hold storage mode and public jobs; nothing provider-specific to keep
        return {}
