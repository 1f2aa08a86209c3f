"""The lifecycle of one Compute instance that rigbase owns, shared by the region's storage node
(storage_node.py) and the burst VMs of jobs (compute_node.py): find it, create it with zone fallback, read
its vTPM endorsement key, delete it; and the parts of the instance both kinds are built from.

Crash safety comes from three rules, so a reconciler can be killed at any step and simply run again:
1. before inserting, look for our instance in every zone and adopt it if it is there;
2. every insert carries a requestId derived from our own ids and the zone: a retry gets the same
   operation back from Compute, never a second instance;
3. a 409 "already exists" is adoption, not failure.
Operations are waited on explicitly with ZoneOperationsClient.wait (ExtendedOperation.result() polls
through a client built without our endpoint) and at most 2 calls per second (operations.py)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from contracts.errors import Conflict, Unavailable
from provisioner.providers import base
from provisioner.providers.gcp import operations
from provisioner.providers.gcp.capacity import LOCAL_SSD_PARTITION_GB
from provisioner.providers.gcp.naming import label_value

if TYPE_CHECKING:  # pragma: no cover
    from provisioner.providers.gcp.clients import GcpContext

BOOT_DISK_GB = 50  # the image's state partition grows to fill it at first boot (rigbase-grow-state)
BUNDLE_METADATA_KEY = "rigbase-bundle"  # what the image's `minion gce-bundle` reads (minion/gce_metadata.py)
NO_IMAGE = "no rigbase image is published for this region"


@dataclass(frozen=True)
class Instance:
    name: str
    zone: str
    adopted: bool  # True when it already existed (a resumed reconcile)
    status: str


@dataclass(frozen=True)
class Owned:
    """The instance we mean to own: its name, the zones it may stand in (tried in this order), and the
    label whose value proves a same-named instance is ours and not someone else's."""

    name: str
    zones: tuple[str, ...]
    owner_label: str
    owner_id: str  # the label's expected value, before naming.label_value
    made_for: str  # what it was made for, in the refusal: "region eu", "job j-1"


@dataclass(frozen=True)
class Recipe:
    """How to insert it in one zone, and what to say when no zone would take it."""

    build: Callable[[str], Any]  # zone → the compute_v1.Instance to insert
    request_id: Callable[[str], str]  # zone → the requestId (derived from our ids: rule 2)
    next_zone_errors: frozenset[str]  # the zone-level refusals after which another zone may succeed
    none_left: Callable[[str], str]  # each zone's refusal, "; "-joined → the ProvisionFailed message


def find(ctx: GcpContext, owned: Owned) -> Instance | None:
    """Our instance in any of its zones, or None. Refuses a same-named instance that is not ours."""
    from google.api_core import exceptions as gexc

    for zone in owned.zones:
        try:
            inst = ctx.instances.get(project=ctx.project, zone=zone, instance=owned.name)
        except gexc.NotFound:
            continue
        if inst.labels.get(owned.owner_label) != label_value(owned.owner_id):
            raise Conflict(
                f"instance {owned.name} in {zone} exists but was not made for {owned.made_for}: "
                "delete or rename it, or use another name prefix"
            )
        return Instance(name=inst.name, zone=zone, adopted=True, status=inst.status)
    return None


def create(  # noqa: C901
    ctx: GcpContext,
    owned: Owned,
    recipe: Recipe,
    *,
    on_progress: Callable[[str], None] | None = None,
    wait_timeout_s: float = 900.0,
) -> Instance:
    """Create (or adopt) the instance, trying its zones in order; ProvisionFailed naming each zone's
    refusal when none would take it."""
    from google.api_core import exceptions as gexc
    from google.cloud import compute_v1

    say = on_progress or (lambda _msg: None)
    existing = find(ctx, owned)
    if existing:
        say(f"adopting {existing.name} in {existing.zone} ({existing.status})")
        return existing
    reasons: list[str] = []
    for zone in owned.zones:
        rid = recipe.request_id(zone)
        say(f"inserting {owned.name} in {zone} (requestId {rid})")
        try:
            op = ctx.instances.insert_unary(
                request=compute_v1.InsertInstanceRequest(
                    project=ctx.project, zone=zone, instance_resource=recipe.build(zone), request_id=rid
                )
            )
        except gexc.Conflict:
            node = find(ctx, owned)
            if node:
                say(f"{owned.name} already exists in {node.zone}: adopted")
                return node
            raise
        except gexc.GoogleAPICallError as exc:
            reason = _call_error_reason(exc)
            if reason in recipe.next_zone_errors:
                reasons.append(f"{zone}: {reason}")
                continue
            raise Unavailable(f"inserting {owned.name} in {zone} failed: {exc.message}") from None
        op = operations.wait(
            ctx, op.name, zone=zone, timeout_s=wait_timeout_s, on_progress=partial(_say_progress, say, zone)
        )
        err = operations.error_of(op)
        if err is None:
            inst = ctx.instances.get(project=ctx.project, zone=zone, instance=owned.name)
            return Instance(name=inst.name, zone=zone, adopted=False, status=inst.status)
        code, message = err
        if code in recipe.next_zone_errors:
            reasons.append(f"{zone}: {code}")
            say(f"{zone}: {code}, trying the next zone")
            continue
        if code in ("alreadyExists", "409"):
            node = find(ctx, owned)
            if node:
                return node
        raise Unavailable(f"creating {owned.name} in {zone} failed: {code} {message}")
    raise base.ProvisionFailed(recipe.none_left("; ".join(reasons)))


def _say_progress(say: Callable[[str], None], zone: str, op: Any) -> None:
    """One line per polled insert operation, naming the zone being tried (bound per zone with partial)."""
    say(f"{zone}: {op.status.name} {op.progress}%")


def _call_error_reason(exc: Any) -> str:
    """The reason of an HTTP error (e.g. QUOTA_EXCEEDED) from the error's details."""
    for detail in getattr(exc, "errors", None) or []:
        if isinstance(detail, Mapping) and detail.get("reason"):
            return str(detail["reason"])
    return getattr(exc, "reason", None) or ""


def ek_public(ctx: GcpContext, node: Instance) -> str:
    """The vTPM's EK public key (PEM) from instances.getShieldedInstanceIdentity: the control plane
    pins it before the node's attested join, since a vTPM has no vendor EK certificate chain."""
    ident = ctx.instances.get_shielded_instance_identity(
        project=ctx.project, zone=node.zone, instance=node.name
    )
    pem = ident.encryption_key.ek_pub
    if not pem:
        raise Unavailable(f"{node.name} has no vTPM endorsement key yet: wait for it to boot and try again")
    return str(pem)


def delete(ctx: GcpContext, name: str, zones: tuple[str, ...], *, wait_timeout_s: float = 900.0) -> bool:
    """Delete the instance called `name` in whichever of `zones` holds it (its auto_delete disks go with
    it). False if absent. No requestId: a delete is idempotent by itself (a retry finds nothing), and a
    derived id would replay a stale operation if the same name were made and removed again within the
    hour."""
    from google.api_core import exceptions as gexc

    for zone in zones:
        try:
            op = ctx.instances.delete_unary(project=ctx.project, zone=zone, instance=name)
        except gexc.NotFound:
            continue
        op = operations.wait(ctx, op.name, zone=zone, timeout_s=wait_timeout_s)
        err = operations.error_of(op)
        if err:
            raise Unavailable(f"deleting {name} failed: {err[0]} {err[1]}")
        return True
    return False


def disks(labels: Mapping[str, str], zone: str, local_ssds: int, image: str) -> list[Any]:
    """The boot disk made from the region's published rigbase image (labelled like the instance) and
    `local_ssds` 375 GB NVMe scratch partitions; all deleted with the instance."""
    from google.cloud import compute_v1

    if not image:
        raise base.ProvisionFailed(
            f"{NO_IMAGE}: publish one with `provision image publish DIR/manifest.json --provider gcp`"
        )
    boot = compute_v1.AttachedDisk(
        boot=True,
        auto_delete=True,
        type_="PERSISTENT",
        initialize_params=compute_v1.AttachedDiskInitializeParams(
            source_image=image, disk_size_gb=BOOT_DISK_GB, labels=dict(labels)
        ),
    )
    scratch = [
        compute_v1.AttachedDisk(
            type_="SCRATCH",
            interface="NVME",
            auto_delete=True,
            initialize_params=compute_v1.AttachedDiskInitializeParams(
                disk_type=f"zones/{zone}/diskTypes/local-ssd", disk_size_gb=LOCAL_SSD_PARTITION_GB
            ),
        )
        for _ in range(local_ssds)
    ]
    return [boot, *scratch]


def egress_network() -> list[Any]:
    """The default network with an external IP for egress only (the minion dials the control plane)."""
    from google.cloud import compute_v1

    return [
        compute_v1.NetworkInterface(
            network="global/networks/default",
            access_configs=[compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")],
        )
    ]


def bundle_metadata(bundle: Mapping[str, Any]) -> Any:
    """The enrollment bundle (docs/enrollment-bundle.md), which the image's rigbase-gce-bundle.service
    reads from the metadata server before the minion starts."""
    from google.cloud import compute_v1

    return compute_v1.Metadata(
        items=[compute_v1.Items(key=BUNDLE_METADATA_KEY, value=json.dumps(dict(bundle), sort_keys=True))]
    )
