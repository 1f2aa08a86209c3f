"""The provider abstraction: one small base class, one module per provider (physical.py, gcp/).

A provider validates what an operator gives it (its configuration when enabled, the options of a
region) and describes what it must create; the services store the result and the reconcilers do the
slow work. Heavy client libraries are imported only inside the provider module that needs them, so
`provision --help` stays instant."""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass(frozen=True)
class ProviderConfig:
    """What enabling a provider stores: `public` is shown by the API, `secret` is sealed at rest."""

    payment_mode: str
    public: dict[str, Any] = field(default_factory=dict)
    secret: bytes | None = None


@dataclass(frozen=True)
class PlannedAction:
    """One thing a provider would create or delete; `--dry-run` prints these and stops."""

    verb: str  # "create" | "delete" | "update"
    kind: str  # e.g. "pubsub-topic", "instance", "firewall"
    name: str
    detail: str = ""


class Provider(ABC):
    """Base of every provider. Subclasses are stateless: state lives in the store."""

    kind: ClassVar[str]
    title: ClassVar[str]
    payment_modes: ClassVar[tuple[str, ...]] = ("credits",)
    # True when the provider's reconciler decides its regions' health (GCP: from its storage node and the
    # VM events); the heartbeat-based region-health reconciler then leaves those regions alone
    owns_region_health: ClassVar[bool] = False

    @abstractmethod
    def validate_config(self, raw: Mapping[str, Any]) -> ProviderConfig:
        """Check the operator's input for `provider enable`; raise InvalidInput naming the bad field."""

    @abstractmethod
    def validate_region(self, name: str, options: Mapping[str, Any]) -> dict[str, Any]:
        """Check a new region's provider-specific options; return the settings to store with it."""

    def plan_enable(self, config: ProviderConfig) -> list[PlannedAction]:
        """What enabling creates in the provider's account (nothing for physical)."""
        return []

    def plan_region(self, name: str, settings: Mapping[str, Any]) -> list[PlannedAction]:
        """What creating the region creates (the GCP storage node, for example)."""
        return []


# kind → "module:Class"; imported lazily so a missing optional library only matters when used
REGISTRY: dict[str, str] = {
    "physical": "provisioner.providers.physical:PhysicalProvider",
    "gcp": "provisioner.providers.gcp:GcpProvider",
}


def provider_for(kind: str) -> Provider:
    """The provider instance for a kind; raises InvalidInput for an unknown one."""
    from provisioner.errors import InvalidInput

    target = REGISTRY.get(kind)
    if target is None:
        raise InvalidInput(f"unknown provider '{kind}': choose one of {', '.join(sorted(REGISTRY))}")
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)()
