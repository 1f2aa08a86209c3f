"""The storage node of a GCP region: one Shielded VM with local SSDs that caches jobs, models,
checkpoints and datasets for the region (docs/product-rules.md "GCP regions": every GCP region has one).

Its lifecycle (adopt-before-insert, requestIds, zone fallback, 409 as adoption) is instances.py's; this
module says what the node is: its storage class, name, labels, requestId and instance shape."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from contracts.errors import InvalidInput
from provisioner.providers.gcp import instances, naming
from provisioner.providers.gcp.capacity import LOCAL_SSD_PARTITION_GB

if TYPE_CHECKING:  # pragma: no cover
    from provisioner.providers.gcp.clients import GcpContext


@dataclass(frozen=True)
class StorageClass:
    """A storage class as the operator picks it → the VM that serves it.

    N2 machines take local SSDs in counts 1, 2, 4, 8, 16, 24 (375 GB each, NVMe); the vCPU count grows
    with the cache so NFS throughput keeps up with the disks (about 2 vCPU per 375 GB partition)."""

    name: str
    machine_type: str
    local_ssds: int
    description: str

    @property
    def cache_gb(self) -> int:
        return self.local_ssds * LOCAL_SSD_PARTITION_GB


STORAGE_CLASSES: dict[str, StorageClass] = {
    c.name: c
    for c in (
        StorageClass("small", "n2-standard-8", 4, "1.5 TB cache, for a few jobs at a time"),
        StorageClass("medium", "n2-standard-16", 8, "3 TB cache"),
        StorageClass("large", "n2-standard-32", 16, "6 TB cache"),
        StorageClass("xlarge", "n2-standard-48", 24, "9 TB cache, the N2 maximum of 24 local SSDs"),
    )
}

# the zone-level errors after which another zone of the same region may succeed
NEXT_ZONE_ERRORS = frozenset(
    {"QUOTA_EXCEEDED", "ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"}
)


def storage_class(name: str) -> StorageClass:
    try:
        return STORAGE_CLASSES[name]
    except KeyError:
        raise InvalidInput(
            f"unknown storage class '{name}': choose one of {', '.join(STORAGE_CLASSES)}"
        ) from None


@dataclass(frozen=True)
class StorageNodeSpec:
    """What the reconciler knows about the node it must make (all from the store)."""

    region_id: str  # our id; names and requestIds derive from it
    region: str  # our region name
    gcp_region: str
    zones: tuple[str, ...]
    storage_class: StorageClass
    bundle: Mapping[str, Any]  # docs/enrollment-bundle.md
    prefix: str = naming.DEFAULT_PREFIX
    image: str = ""  # the region's published rigbase image (images.source_image); "" for a delete

    @property
    def instance_name(self) -> str:
        return naming.gcp_name(self.prefix, "storage", self.region)

    def labels(self) -> dict[str, str]:
        return naming.labels(
            self.prefix,
            **{
                naming.REGION_LABEL: self.region,
                naming.REGION_ID_LABEL: self.region_id,
                naming.ROLE_LABEL: "storage",
            },
        )

    def request_id(self, project: str, zone: str) -> str:
        return naming.request_id(project, self.region_id, "storage-node", zone)


StorageNode = instances.Instance
ek_public = instances.ek_public


def build_instance(spec: StorageNodeSpec, project: str, zone: str) -> Any:
    """The compute_v1.Instance to insert (Shielded VM with vTPM, local SSD scratch, labels, bundle)."""
    from google.cloud import compute_v1

    sc = spec.storage_class
    return compute_v1.Instance(
        name=spec.instance_name,
        description=f"rigbase storage node of region {spec.region} ({spec.region_id}); managed by rigbase",
        machine_type=f"zones/{zone}/machineTypes/{sc.machine_type}",
        labels=spec.labels(),
        tags=compute_v1.Tags(items=[naming.network_tag(spec.prefix)]),
        disks=instances.disks(spec.labels(), zone, sc.local_ssds, spec.image),
        network_interfaces=instances.egress_network(),
        # Secure Boot off: systemd-boot and the UKI are not signed by a key the firmware trusts; what booted
        # is proven by the vTPM's PCR 4, 11 and 12 at the attested join instead
        shielded_instance_config=compute_v1.ShieldedInstanceConfig(
            enable_secure_boot=False, enable_vtpm=True, enable_integrity_monitoring=True
        ),
        scheduling=compute_v1.Scheduling(
            on_host_maintenance="MIGRATE", automatic_restart=True, preemptible=False
        ),
        metadata=instances.bundle_metadata(spec.bundle),
    )


def owned(spec: StorageNodeSpec) -> instances.Owned:
    """The node as instances.py looks for it: ours when its region-id label is this region's id."""
    return instances.Owned(
        name=spec.instance_name,
        zones=spec.zones,
        owner_label=naming.REGION_ID_LABEL,
        owner_id=spec.region_id,
        made_for=f"region {spec.region}",
    )


def find(ctx: GcpContext, spec: StorageNodeSpec) -> StorageNode | None:
    """Our instance in any zone of the region, or None. Refuses a same-named instance that is not ours."""
    return instances.find(ctx, owned(spec))


def create(
    ctx: GcpContext,
    spec: StorageNodeSpec,
    *,
    on_progress: Callable[[str], None] | None = None,
    wait_timeout_s: float = 900.0,
) -> StorageNode:
    """Create (or adopt) the storage node, trying the region's zones in order."""
    recipe = instances.Recipe(
        build=partial(build_instance, spec, ctx.project),
        request_id=partial(spec.request_id, ctx.project),
        next_zone_errors=NEXT_ZONE_ERRORS,
        none_left=lambda reasons: (
            f"no zone of {spec.gcp_region} could take the storage node ({reasons}): "
            "request more quota or pick another storage class or region"
        ),
    )
    return instances.create(ctx, owned(spec), recipe, on_progress=on_progress, wait_timeout_s=wait_timeout_s)


def delete(ctx: GcpContext, spec: StorageNodeSpec, *, wait_timeout_s: float = 900.0) -> bool:
    """Delete our storage node (its boot disk and local SSDs go with it: auto_delete). False if absent."""
    node = find(ctx, spec)
    if node is None:
        return False
    return instances.delete(ctx, node.name, (node.zone,), wait_timeout_s=wait_timeout_s)
