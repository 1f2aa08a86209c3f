"""The Google Cloud provider: `GcpProvider` plus the call points the services and reconcilers use.

One module per concern: credentials (key validation), catalogue (regions/ data), capacity (the quota
rule), quota (`region quota`), clients (every Google client, endpoint-overridable), permissions
(testIamPermissions → missing roles), bootstrap (project resources), storage_node (the region's VM),
compute_node (a job's burst VM), operations (explicit waits), events (Pub/Sub consumer → node state),
naming (prefix, labels, requestIds).
Importing this package imports no Google library; each call point imports what it needs."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

from cryptography.hazmat.primitives import serialization

from contracts.errors import InvalidInput
from provisioner.domain.health import RegionHealthView
from provisioner.domain.states import ONLINE_WINDOW, NodeState
from provisioner.providers.base import (
    EventWatch,
    Feature,
    NodeEvent,
    PlannedAction,
    Progress,
    ProviderConfig,
    ProviderDriver,
    RegionNode,
    RegionNodeSpec,
)
from provisioner.providers.gcp import bootstrap, catalogue, credentials, naming, storage_node
from provisioner.providers.gcp.capacity import LOCAL_SSD_PARTITION_GB
from provisioner.providers.gcp.clients import Endpoints, GcpContext
from provisioner.providers.gcp.events import EventConsumer

__all__ = ["GcpProvider", "Endpoints", "GcpContext"]

RUNNING_STATUSES = frozenset({"RUNNING", "PROVISIONING", "STAGING"})  # Compute's instance statuses that run


class GcpProvider(ProviderDriver):
    kind: ClassVar[str] = "gcp"
    features: ClassVar[frozenset[Feature]] = frozenset(Feature)
    title: ClassVar[str] = "Google Cloud"
    # on demand only (docs/product-rules.md "Google Cloud provider"); the payment mode is how the
    # operator pays rigbase's fees, same choices as physical
    payment_modes: ClassVar[tuple[str, ...]] = ("credits",)

    def __init__(
        self, *, regions_dir: Path | None = None, endpoints: Endpoints | None = None, anonymous: bool = False
    ) -> None:
        """`regions_dir`: catalogue data instead of the shipped one (settings' `regions_dir`).
        `endpoints` + `anonymous`: clients pointed at local servers with AnonymousCredentials — what tests
        and the benchmark inject (the fakes check no token and Google's token endpoint is out of reach)."""
        self.regions_dir = regions_dir
        self.endpoints = endpoints
        self.anonymous = anonymous

    def catalogue(self) -> catalogue.Catalogue:
        return catalogue.load(self.regions_dir)

    # --- region health ---------------------------------------------------------------------------
    def unhealthy_because(self, view: RegionHealthView) -> str | None:
        """A GCP region serves only while its storage node's VM runs (Compute's events), the node is
        active (joined and attested) and it reports (heartbeats within the online window)."""
        node = view.storage_node
        if node is None:
            return "its storage node is not created yet"
        if not node.vm_running:
            return f"storage node {node.name}: its VM is not running"
        if node.state != NodeState.ACTIVE:
            return f"storage node {node.name} is {node.state}"
        if not node.reporting:
            return f"storage node {node.name} has not reported for {ONLINE_WINDOW.total_seconds():.0f} s"
        return None

    def healthy_because(self, view: RegionHealthView) -> str:
        return f"storage node {view.storage_node.name if view.storage_node else '?'} is active and reporting"

    # --- validation (no network) -----------------------------------------------------------------
    def validate_config(self, raw: Mapping[str, Any]) -> ProviderConfig:
        """raw: {"credentials": key JSON (str|bytes; the CLI reads `-` from stdin), "payment_mode"?,
        "prefix"?}."""
        payment_mode = raw.get("payment_mode") or self.payment_modes[0]
        if payment_mode not in self.payment_modes:
            raise InvalidInput(
                f"payment mode '{payment_mode}' is not offered: choose one of {', '.join(self.payment_modes)}"
            )
        if not raw.get("credentials"):
            raise InvalidInput(
                "credentials: give the service-account key file with --credentials FILE (or - for stdin)"
            )
        key = credentials.parse_key(raw["credentials"])
        prefix = raw.get("prefix") or naming.DEFAULT_PREFIX
        if naming.gcp_name(prefix) != prefix or len(prefix) > 20:
            raise InvalidInput(
                f"prefix '{prefix}' must be ≤ 20 lowercase letters, digits or '-': e.g. rigbase"
            )
        return ProviderConfig(
            payment_mode=payment_mode, public={**key.public(), "prefix": prefix}, secret=key.raw
        )

    def validate_region(self, name: str, options: Mapping[str, Any]) -> dict[str, Any]:
        """options: {"gcp_region"? (default: the region's name), "storage_class"}; refuses regions outside
        the catalogue. The quota check (needs the API) is `region_quota`, called by the service."""
        gcp_region = options.get("gcp_region") or name
        entry = self.catalogue().region(gcp_region)
        if not options.get("storage_class"):
            raise InvalidInput(
                "--storage-class is required for a GCP region: "
                f"choose one of {', '.join(storage_node.STORAGE_CLASSES)}"
            )
        sc = storage_node.storage_class(options["storage_class"])
        return {
            "gcp_region": gcp_region,
            "zones": list(entry.zones),
            "storage_class": sc.name,
            "machine_type": sc.machine_type,
            "local_ssds": sc.local_ssds,
        }

    # --- plans (--dry-run) -------------------------------------------------------------------------
    def plan_enable(self, config: ProviderConfig) -> list[PlannedAction]:
        return bootstrap.plan(self.names(config))

    def plan_region(self, name: str, settings: Mapping[str, Any]) -> list[PlannedAction]:
        sc = storage_node.storage_class(settings["storage_class"])
        spec_name = naming.gcp_name(settings.get("prefix") or naming.DEFAULT_PREFIX, "storage", name)
        return [
            PlannedAction(
                "create",
                "instance",
                spec_name,
                f"{sc.machine_type}, {sc.local_ssds} × {LOCAL_SSD_PARTITION_GB} GB local SSD "
                f"({sc.cache_gb} GB cache), "
                "Shielded VM + vTPM, "
                f"first free zone of {', '.join(settings['zones'])}",
            )
        ]

    # --- call points for services / reconcilers ------------------------------------------------------
    @staticmethod
    def names(config: ProviderConfig) -> bootstrap.Names:
        return bootstrap.Names(
            project=config.public["project_id"], prefix=config.public.get("prefix", naming.DEFAULT_PREFIX)
        )

    def context(self, config: ProviderConfig) -> GcpContext:
        """Clients for the project in `config` (secret = the unsealed key bytes), at this driver's
        endpoints."""
        if config.secret is None:
            raise InvalidInput("the GCP provider has no stored key: enable it again with --credentials")
        key = credentials.parse_key(config.secret)
        if self.anonymous and self.endpoints is not None:
            return GcpContext.anonymous(key.project_id, self.endpoints)
        return GcpContext.from_key(key, self.endpoints)

    @staticmethod
    def storage_node_spec(
        region_id: str,
        region: str,
        settings: Mapping[str, Any],
        bundle: Mapping[str, Any],
        prefix: str = naming.DEFAULT_PREFIX,
        image: str | None = None,
    ) -> storage_node.StorageNodeSpec:
        return storage_node.StorageNodeSpec(
            region_id=region_id,
            region=region,
            gcp_region=settings["gcp_region"],
            zones=tuple(settings["zones"]),
            storage_class=storage_node.storage_class(settings["storage_class"]),
            bundle=bundle,
            prefix=prefix,
            image=image or "",
        )

    @staticmethod
    def storage_spec(spec: RegionNodeSpec) -> storage_node.StorageNodeSpec:
        return GcpProvider.storage_node_spec(
            spec.region_id,
            spec.region,
            spec.settings,
            spec.bundle,
            prefix=spec.settings.get("prefix", naming.DEFAULT_PREFIX),
            image=spec.image,
        )

    # --- lifecycle (the reconcilers call these; each talks to Google) ------------------------------------
    def bootstrap(self, config: ProviderConfig, on_progress: Progress) -> list[PlannedAction]:
        return bootstrap.apply(self.context(config), self.names(config), on_progress=on_progress)

    def teardown(self, config: ProviderConfig, on_progress: Progress) -> list[PlannedAction]:
        return bootstrap.teardown(self.context(config), self.names(config), on_progress=on_progress)

    def create_region_node(
        self, config: ProviderConfig, spec: RegionNodeSpec, on_progress: Progress
    ) -> RegionNode:
        made = storage_node.create(self.context(config), self.storage_spec(spec), on_progress=on_progress)
        return RegionNode(
            name=made.name, zone=made.zone, adopted=made.adopted, running=made.status in RUNNING_STATUSES
        )

    def region_node_ek(self, config: ProviderConfig, node: RegionNode) -> bytes:
        """The vTPM's EK (Compute gives PEM) as DER SubjectPublicKeyInfo."""
        made = storage_node.StorageNode(name=node.name, zone=node.zone, adopted=True, status="")
        pem = storage_node.ek_public(self.context(config), made)
        key = serialization.load_pem_public_key(pem.encode())
        return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)

    def delete_region_node(self, config: ProviderConfig, spec: RegionNodeSpec) -> bool:
        return storage_node.delete(self.context(config), self.storage_spec(spec))

    def watch_events(
        self, config: ProviderConfig, on_event: Callable[[NodeEvent], None]
    ) -> EventWatch | None:
        names = self.names(config)
        return EventConsumer(self.context(config), names.subscription, on_event, prefix=names.prefix)
