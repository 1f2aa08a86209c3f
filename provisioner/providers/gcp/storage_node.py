"""The storage node of a GCP region: one Shielded VM with local SSDs that caches jobs, models,
checkpoints and datasets for the region (docs/product-rules.md "GCP regions": every GCP region has one).

Crash safety comes from three rules, so the reconciler can be killed at any step and simply run again:
1. before inserting, look for our instance in every zone of the region and adopt it if it is there;
2. every insert carries a requestId derived from (project, region id, zone): a retry gets the same
   operation back from Compute, never a second instance;
3. a 409 "already exists" is adoption, not failure.
Operations are waited on explicitly with ZoneOperationsClient.wait (ExtendedOperation.result() polls
through a client built without our endpoint) and at most 2 calls per second."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from contracts.errors import Conflict, InvalidInput, Unavailable
from provisioner.providers import base
from provisioner.providers.gcp import naming, operations
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

BOOT_IMAGE = "projects/debian-cloud/global/images/family/debian-12"
BOOT_DISK_GB = 50
BUNDLE_METADATA_KEY = "rigbase-bundle"
# the zone-level errors after which another zone of the same region may succeed
NEXT_ZONE_ERRORS = frozenset(
    {"QUOTA_EXCEEDED", "ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"}
)

# The startup script only fetches the bundle from the metadata server and hands it to the minion; the
# storage node then joins with attestation (vTPM) like any node.
STARTUP_SCRIPT = """#!/bin/sh
set -eu
install -d -m 0700 /etc/rigbase
curl -fsS -H 'Metadata-Flavor: Google' \\
  'http://metadata.google.internal/computeMetadata/v1/instance/attributes/rigbase-bundle' \\
  > /etc/rigbase/bundle.json
chmod 0600 /etc/rigbase/bundle.json
if command -v minion >/dev/null; then minion join --bundle /etc/rigbase/bundle.json; fi
"""


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


@dataclass(frozen=True)
class StorageNode:
    name: str
    zone: str
    adopted: bool  # True when it already existed (a resumed reconcile)
    status: str


def build_instance(spec: StorageNodeSpec, project: str, zone: str) -> Any:
    """The compute_v1.Instance to insert (Shielded VM with vTPM, local SSD scratch, labels, bundle)."""
    from google.cloud import compute_v1

    sc = spec.storage_class
    disks = [
        compute_v1.AttachedDisk(
            boot=True,
            auto_delete=True,
            type_="PERSISTENT",
            initialize_params=compute_v1.AttachedDiskInitializeParams(
                source_image=BOOT_IMAGE, disk_size_gb=BOOT_DISK_GB, labels=spec.labels()
            ),
        )
    ]
    disks += [
        compute_v1.AttachedDisk(
            type_="SCRATCH",
            interface="NVME",
            auto_delete=True,
            initialize_params=compute_v1.AttachedDiskInitializeParams(
                disk_type=f"zones/{zone}/diskTypes/local-ssd", disk_size_gb=LOCAL_SSD_PARTITION_GB
            ),
        )
        for _ in range(sc.local_ssds)
    ]
    return compute_v1.Instance(
        name=spec.instance_name,
        description=f"rigbase storage node of region {spec.region} ({spec.region_id}); managed by rigbase",
        machine_type=f"zones/{zone}/machineTypes/{sc.machine_type}",
        labels=spec.labels(),
        tags=compute_v1.Tags(items=[naming.network_tag(spec.prefix)]),
        disks=disks,
        network_interfaces=[
            compute_v1.NetworkInterface(
                network="global/networks/default",
                # outbound only (the minion dials the control plane); the external IP is for egress
                access_configs=[compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")],
            )
        ],
        shielded_instance_config=compute_v1.ShieldedInstanceConfig(
            enable_secure_boot=True, enable_vtpm=True, enable_integrity_monitoring=True
        ),
        scheduling=compute_v1.Scheduling(
            on_host_maintenance="MIGRATE", automatic_restart=True, preemptible=False
        ),
        metadata=compute_v1.Metadata(
            items=[
                compute_v1.Items(
                    key=BUNDLE_METADATA_KEY, value=json.dumps(dict(spec.bundle), sort_keys=True)
                ),
                compute_v1.Items(key="startup-script", value=STARTUP_SCRIPT),
            ]
        ),
    )


def find(ctx: GcpContext, spec: StorageNodeSpec) -> StorageNode | None:
    """Our instance in any zone of the region, or None. Refuses a same-named instance that is not ours."""
    from google.api_core import exceptions as gexc

    for zone in spec.zones:
        try:
            inst = ctx.instances.get(project=ctx.project, zone=zone, instance=spec.instance_name)
        except gexc.NotFound:
            continue
        if inst.labels.get(naming.REGION_ID_LABEL) != naming.label_value(spec.region_id):
            raise Conflict(
                f"instance {spec.instance_name} in {zone} exists but was not made for region {spec.region}: "
                "delete or rename it, or use another name prefix"
            )
        return StorageNode(name=inst.name, zone=zone, adopted=True, status=inst.status)
    return None


def create(
    ctx: GcpContext,
    spec: StorageNodeSpec,
    *,
    on_progress: Callable[[str], None] | None = None,
    wait_timeout_s: float = 900.0,
) -> StorageNode:
    """Create (or adopt) the storage node, trying the region's zones in order."""
    from google.api_core import exceptions as gexc
    from google.cloud import compute_v1

    say = on_progress or (lambda _msg: None)
    existing = find(ctx, spec)
    if existing:
        say(f"adopting {existing.name} in {existing.zone} ({existing.status})")
        return existing
    reasons: list[str] = []
    for zone in spec.zones:
        rid = spec.request_id(ctx.project, zone)
        say(f"inserting {spec.instance_name} in {zone} (requestId {rid})")
        try:
            op = ctx.instances.insert_unary(
                request=compute_v1.InsertInstanceRequest(
                    project=ctx.project,
                    zone=zone,
                    instance_resource=build_instance(spec, ctx.project, zone),
                    request_id=rid,
                )
            )
        except gexc.Conflict:
            node = find(ctx, spec)
            if node:
                say(f"{spec.instance_name} already exists in {node.zone}: adopted")
                return node
            raise
        except gexc.GoogleAPICallError as exc:
            reason = _call_error_reason(exc)
            if reason in NEXT_ZONE_ERRORS:
                reasons.append(f"{zone}: {reason}")
                continue
            raise Unavailable(f"inserting {spec.instance_name} in {zone} failed: {exc.message}") from None
        op = operations.wait(
            ctx,
            op.name,
            zone=zone,
            timeout_s=wait_timeout_s,
            on_progress=partial(_say_progress, say, zone),
        )
        err = operations.error_of(op)
        if err is None:
            inst = ctx.instances.get(project=ctx.project, zone=zone, instance=spec.instance_name)
            return StorageNode(name=inst.name, zone=zone, adopted=False, status=inst.status)
        code, message = err
        if code in NEXT_ZONE_ERRORS:
            reasons.append(f"{zone}: {code}")
            say(f"{zone}: {code}, trying the next zone")
            continue
        if code == "alreadyExists" or code == "409":
            node = find(ctx, spec)
            if node:
                return node
        raise Unavailable(f"creating {spec.instance_name} in {zone} failed: {code} {message}")
    raise base.ProvisionFailed(  # every zone refused: the message names each zone's reason
        f"no zone of {spec.gcp_region} could take the storage node ({'; '.join(reasons)}): "
        "request more quota or pick another storage class or region"
    )


def _say_progress(say: Callable[[str], None], zone: str, op: Any) -> None:
    """One line per polled insert operation, naming the zone being tried (bound per zone with partial)."""
    say(f"{zone}: {op.status.name} {op.progress}%")


def _call_error_reason(exc: Any) -> str:
    """The reason of an HTTP error (e.g. QUOTA_EXCEEDED) from the error's details."""
    for detail in getattr(exc, "errors", None) or []:
        if isinstance(detail, Mapping) and detail.get("reason"):
            return str(detail["reason"])
    return getattr(exc, "reason", None) or ""


def ek_public(ctx: GcpContext, node: StorageNode) -> str:
    """The vTPM's EK public key (PEM) from instances.getShieldedInstanceIdentity: the control plane
    pins it before the node's attested join, since a vTPM has no vendor EK certificate chain."""
    ident = ctx.instances.get_shielded_instance_identity(
        project=ctx.project, zone=node.zone, instance=node.name
    )
    pem = ident.encryption_key.ek_pub
    if not pem:
        raise Unavailable(f"{node.name} has no vTPM endorsement key yet: wait for it to boot and try again")
    return pem


def delete(ctx: GcpContext, spec: StorageNodeSpec, *, wait_timeout_s: float = 900.0) -> bool:
    """Delete our storage node (its boot disk and local SSDs go with it: auto_delete). False if absent."""
    node = find(ctx, spec)
    if node is None:
        return False
    from google.api_core import exceptions as gexc

    try:
        # no requestId: delete is idempotent by itself (a retry finds nothing), and a derived id would
        # replay a stale operation if the region were re-created and removed again within the hour
        op = ctx.instances.delete_unary(project=ctx.project, zone=node.zone, instance=node.name)
    except gexc.NotFound:
        return False
    op = operations.wait(ctx, op.name, zone=node.zone, timeout_s=wait_timeout_s)
    err = operations.error_of(op)
    if err:
        raise Unavailable(f"deleting {node.name} failed: {err[0]} {err[1]}")
    return True
