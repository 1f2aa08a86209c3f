"""The provider abstraction: one base class, one module per provider (physical.py, gcp/).

Like MAAS's power drivers, a provider is a driver the rest of the control plane calls through one
interface and never looks inside: it validates what an operator gives it (its configuration when
enabled, the options of a region) and describes what it must create (plans); the services record the
operator's intent in the store; the reconcilers then call the provider's lifecycle — bootstrap and
teardown of what it makes in the operator's account, the node it runs for each region, the events it
reports about that node — outside any transaction and record the outcome. A provider that makes
nothing (physical) keeps the defaults. Heavy client libraries are imported only inside the provider
module that needs them, so `provision --help` stays instant."""

from __future__ import annotations

import enum
import functools
import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from contracts.errors import InvalidInput, Unavailable
from provisioner.domain.health import RegionHealthView
from provisioner.domain.states import ONLINE_WINDOW

Progress = Callable[[str], None]  # one line of progress, saved where `--wait` shows it


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


@dataclass(frozen=True)
class RegionNodeSpec:
    """The node a provider runs for a region (GCP: the storage node's VM), as the reconciler asks for it."""

    region_id: str
    region: str
    settings: Mapping[str, Any]  # what validate_region returned, plus the provider's prefix
    bundle: Mapping[str, Any]  # the enrollment bundle the node joins with (docs/enrollment-bundle.md)
    image: str | None = None  # the boot image (GCP: the region's published family); None: not published


@dataclass(frozen=True)
class RegionNode:
    """A region node as the provider found or made it."""

    name: str
    zone: str
    adopted: bool  # it already existed (a resumed reconcile)
    running: bool


class ProvisionFailed(Unavailable):
    """The provider could not make what was asked, for a reason retrying will not fix (every zone
    refused, say); the message names the reasons."""


class NodeEventKind(enum.StrEnum):
    OFFLINE = "offline"  # the node's machine stopped running: its region goes offline
    STARTED = "started"  # it runs again; the node comes back when its minion heartbeats
    DELETED = "deleted"  # it is gone


@dataclass(frozen=True)
class NodeEvent:
    """What a provider reports about one of its nodes' machines (GCP: Compute's log entries)."""

    kind: NodeEventKind
    reason: str
    instance: str
    zone: str
    method: str
    timestamp: str


class EventWatch(Protocol):
    """A running subscription to a provider's node events (started by the events reconciler)."""

    def start(self) -> None: ...

    def stop(self, timeout: float = 5.0) -> None: ...

    @property
    def running(self) -> bool: ...


class Feature(enum.StrEnum):
    """What a provider can do beyond holding regions of the operator's own machines. The services ask a
    driver `supports(feature)` (as SkyPilot asks a cloud) and never compare a provider's name."""

    BOOTSTRAP = "bootstrap"  # enabling it makes things in the operator's account (its reconciler's work)
    REGION_NODE = "region-node"  # it runs a machine of its own for each region (GCP: the storage node)
    VMS = "vms"  # it rents VMs: burst compute for jobs and permanent compute nodes
    QUOTA = "quota"  # its regions have quota and capacity to read (`provision region quota`)
    PUBLISHED_IMAGE = "published-image"  # its VMs boot a rigbase image published to it


class ProviderDriver(ABC):
    """Base of every provider driver; the store's `Provider` row is what an operator enabled with it.
    Subclasses are stateless: state lives in the store."""

    kind: ClassVar[str]
    title: ClassVar[str]
    payment_modes: ClassVar[tuple[str, ...]] = ("credits",)
    features: ClassVar[frozenset[Feature]] = frozenset()

    def supports(self, feature: Feature) -> bool:
        return feature in self.features

    @abstractmethod
    def validate_config(self, raw: Mapping[str, Any]) -> ProviderConfig:
        """Check the operator's input for `provider enable`; raise InvalidInput naming the bad field."""

    @abstractmethod
    def validate_region(self, name: str, options: Mapping[str, Any]) -> dict[str, Any]:
        """Check a new region's provider-specific options; return the settings to store with it."""

    def unhealthy_because(self, view: RegionHealthView) -> str | None:
        """Why the region cannot serve now, or None (reconcilers/region_health.py applies the answer).
        Own hardware: healthy while any of its nodes reports."""
        if view.nodes_reporting == 0:
            return f"no node reported in the last {ONLINE_WINDOW.total_seconds():.0f} s"
        return None

    def healthy_because(self, view: RegionHealthView) -> str:
        return f"{view.nodes_reporting} node(s) reporting"

    def plan_enable(self, config: ProviderConfig) -> list[PlannedAction]:
        """What enabling creates in the provider's account (nothing for physical)."""
        return []

    def plan_region(self, name: str, settings: Mapping[str, Any]) -> list[PlannedAction]:
        """What creating the region creates (the GCP storage node, for example)."""
        return []

    # --- lifecycle: slow calls to the provider's API, made by reconcilers outside any transaction -----
    def bootstrap(self, config: ProviderConfig, on_progress: Progress) -> list[PlannedAction]:
        """Create what `plan_enable` listed (idempotent: existing resources are adopted); returns what it
        made."""
        return []

    def teardown(self, config: ProviderConfig, on_progress: Progress) -> list[PlannedAction]:
        """Delete what bootstrap made, and only that; returns what it deleted."""
        return []

    def create_region_node(
        self, config: ProviderConfig, spec: RegionNodeSpec, on_progress: Progress
    ) -> RegionNode:
        """Make (or adopt) the region's node; raise ProvisionFailed when it cannot be made."""
        raise NotImplementedError(f"{self.kind} regions own no node outside the store")

    def region_node_ek(self, config: ProviderConfig, node: RegionNode) -> bytes:
        """The node's TPM endorsement key (DER SubjectPublicKeyInfo), pinned before it joins."""
        raise NotImplementedError(f"{self.kind} regions own no node outside the store")

    def delete_region_node(self, config: ProviderConfig, spec: RegionNodeSpec) -> bool:
        """Delete the region's node and its disks; False when there was none."""
        raise NotImplementedError(f"{self.kind} regions own no node outside the store")

    def watch_events(
        self, config: ProviderConfig, on_event: Callable[[NodeEvent], None]
    ) -> EventWatch | None:
        """A subscription to the provider's node events (not started), or None when it has none."""
        return None


# kind → "module:Class"; imported lazily so a missing optional library only matters when used
REGISTRY: dict[str, str] = {
    "physical": "provisioner.providers.physical:PhysicalProvider",
    "gcp": "provisioner.providers.gcp:GcpProvider",
}


def provider_for(kind: str) -> ProviderDriver:
    """The provider instance for a kind; raises InvalidInput for an unknown one."""
    target = REGISTRY.get(kind)
    if target is None:
        raise InvalidInput(f"unknown provider '{kind}': choose one of {', '.join(sorted(REGISTRY))}")
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)()


@functools.cache
def kinds_supporting(feature: Feature) -> tuple[str, ...]:
    """The registered provider kinds whose driver supports `feature`."""
    return tuple(kind for kind in REGISTRY if provider_for(kind).supports(feature))
