"""The ephemeral compute VM of one job worker placed on GCP capacity (docs/gcp.md "Burst compute for jobs").

Shape: the GPU type's 1-GPU machine type from the catalogue (regions/gcp-gpus.yaml), the GPU as a guest
accelerator where the family attaches one (N1; A2/G2/A3 machine types bundle theirs), scheduling
`onHostMaintenance: TERMINATE` (GPU VMs cannot live-migrate), the Spot provisioning model when the job is
preemptible (deleted, not stopped, when Google takes it back: nothing is left to pay for), local SSDs in
375 GB units for the job's disk, Shielded VM with vTPM, and labels tying it to the job.

Crash safety is instances.py's, shared with the storage node: (1) look for our instance in every zone first
and adopt it; (2) every insert carries a requestId derived from the VM row's id and the zone, so a retry
after a crash gets the same operation back; (3) a 409 is adoption. The caller writes the row before the
first insert.

`managed_instances` lists what carries our labels for the reaper; `is_ours` is the only test it may delete
by, so nothing without our labels is ever touched."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from provisioner.providers.gcp import instances, naming
from provisioner.providers.gcp.capacity import LOCAL_SSD_PARTITION_GB
from provisioner.providers.gcp.catalogue import GpuType

if TYPE_CHECKING:  # pragma: no cover
    from provisioner.providers.gcp.clients import GcpContext

ROLE = "compute"
JOB_LABEL = "rigbase-job"
PERMANENT = "none"  # the job label of a permanent compute node
BURST_VM_LABEL = "rigbase-burst-vm"
# the zone-level refusals after which another zone of the same region may succeed (STOCKOUT is how
# Compute words a zone out of Spot or GPU capacity in some answers)
NEXT_ZONE_ERRORS = frozenset(
    {
        "QUOTA_EXCEEDED",
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
        "STOCKOUT",
    }
)


def local_ssds_for(disk_gb: int) -> int:
    """375 GB partitions that hold the job's disk (at least one: the scratch layout needs it)."""
    return max(1, math.ceil(disk_gb / LOCAL_SSD_PARTITION_GB))


@dataclass(frozen=True)
class ComputeNodeSpec:
    """What the burst reconciler knows about the VM it must make (all from the store)."""

    vm_id: str  # our burst VM row's id: the requestId derives from it
    instance_name: str
    job_id: str
    region_id: str
    region: str
    gcp_region: str
    zones: tuple[str, ...]  # the zones of the region offering this GPU type, in catalogue order
    gpu: GpuType
    gpu_count: int
    local_ssds: int
    preemptible: bool
    bundle: Mapping[str, Any]  # docs/enrollment-bundle.md
    prefix: str = naming.DEFAULT_PREFIX
    image: str = ""  # the region's published rigbase image (images.source_image)
    reservation: str | None = None  # a Compute reservation (committed capacity) the VM must consume
    node_name: str | None = None  # a permanent compute node's name (no job)

    @property
    def permanent(self) -> bool:
        return not self.job_id

    def labels(self) -> dict[str, str]:
        return naming.labels(
            self.prefix,
            **{
                naming.REGION_LABEL: self.region,
                naming.REGION_ID_LABEL: self.region_id,
                naming.ROLE_LABEL: ROLE,
                JOB_LABEL: self.job_id or PERMANENT,
                BURST_VM_LABEL: self.vm_id,
            },
        )

    def request_id(self, project: str, zone: str) -> str:
        return naming.request_id(project, self.vm_id, "burst-vm", zone)


ComputeNode = instances.Instance
ek_public = instances.ek_public
delete = instances.delete  # by name and zones: the reaper deletes what it listed, without a spec


def build_instance(spec: ComputeNodeSpec, project: str, zone: str) -> Any:
    """The compute_v1.Instance to insert (module docstring)."""
    from google.cloud import compute_v1

    accelerators = [
        compute_v1.AcceleratorConfig(
            accelerator_type=f"zones/{zone}/acceleratorTypes/{spec.gpu.accelerator}",
            accelerator_count=spec.gpu_count,
        )
    ]
    machine_type, _cpus = spec.gpu.machine_for(spec.gpu_count)
    if spec.preemptible:
        # Spot: Google may take it back at any time; DELETE (not STOP) so a preempted VM costs nothing
        scheduling = compute_v1.Scheduling(
            provisioning_model="SPOT",
            instance_termination_action="DELETE",
            on_host_maintenance="TERMINATE",
            automatic_restart=False,
            preemptible=True,
        )
    else:
        scheduling = compute_v1.Scheduling(
            provisioning_model="STANDARD", on_host_maintenance="TERMINATE", automatic_restart=True
        )
    if spec.permanent:
        description = f"rigbase compute node {spec.node_name} of region {spec.region}; managed by rigbase"
    else:
        description = (
            f"rigbase burst VM of job {spec.job_id} in region {spec.region}; deleted when the job ends"
        )
    affinity = None
    if spec.reservation:
        # only that reservation: a VM that silently fell back to on-demand would bill at the full price
        affinity = compute_v1.ReservationAffinity(
            consume_reservation_type="SPECIFIC_RESERVATION",
            key="compute.googleapis.com/reservation-name",
            values=[spec.reservation],
        )
    return compute_v1.Instance(
        name=spec.instance_name,
        description=description,
        machine_type=f"zones/{zone}/machineTypes/{machine_type}",
        labels=spec.labels(),
        tags=compute_v1.Tags(items=[naming.network_tag(spec.prefix)]),
        disks=instances.disks(spec.labels(), zone, spec.local_ssds, spec.image),
        # N1 attaches the GPU; A2/G2/A3 machine types come with theirs and refuse a second one
        guest_accelerators=accelerators if spec.gpu.attaches_accelerator else [],
        network_interfaces=instances.egress_network(),
        # Secure Boot off: neither the UKI nor the GPU driver's kernel module is signed by a key the firmware
        # trusts; the vTPM's PCRs prove what booted (attested join)
        shielded_instance_config=compute_v1.ShieldedInstanceConfig(
            enable_secure_boot=False, enable_vtpm=True, enable_integrity_monitoring=True
        ),
        scheduling=scheduling,
        reservation_affinity=affinity,
        metadata=instances.bundle_metadata(spec.bundle),
    )


def owned(spec: ComputeNodeSpec) -> instances.Owned:
    """The VM as instances.py looks for it: ours when its burst-VM label is this VM row's id."""
    return instances.Owned(
        name=spec.instance_name,
        zones=spec.zones,
        owner_label=BURST_VM_LABEL,
        owner_id=spec.vm_id,
        made_for=f"compute node {spec.node_name}" if spec.permanent else f"job {spec.job_id}",
    )


def find(ctx: GcpContext, spec: ComputeNodeSpec) -> ComputeNode | None:
    """Our instance in any zone of the region, or None. Refuses a same-named instance that is not ours."""
    return instances.find(ctx, owned(spec))


def create(
    ctx: GcpContext,
    spec: ComputeNodeSpec,
    *,
    on_progress: Callable[[str], None] | None = None,
    wait_timeout_s: float = 900.0,
) -> ComputeNode:
    """Create (or adopt) the VM, trying the zones in order; ProvisionFailed naming each zone's refusal."""
    recipe = instances.Recipe(
        build=partial(build_instance, spec, ctx.project),
        request_id=partial(spec.request_id, ctx.project),
        next_zone_errors=NEXT_ZONE_ERRORS,
        none_left=lambda reasons: f"no zone of {spec.gcp_region} could take a {spec.gpu.name} VM ({reasons})",
    )
    return instances.create(ctx, owned(spec), recipe, on_progress=on_progress, wait_timeout_s=wait_timeout_s)


@dataclass(frozen=True)
class ManagedInstance:
    name: str
    zone: str
    labels: Mapping[str, str]


def is_ours(labels: Mapping[str, str], prefix: str) -> bool:
    """A burst VM this control plane made: our managed label AND the compute role AND a burst VM id.
    The reaper deletes nothing else, whatever a list filter returned."""
    return (
        labels.get(naming.MANAGED_LABEL) == naming.label_value(prefix)
        and labels.get(naming.ROLE_LABEL) == ROLE
        and bool(labels.get(BURST_VM_LABEL))
    )


def managed_instances(ctx: GcpContext, prefix: str) -> Iterator[ManagedInstance]:
    """Every instance of the project with our burst labels (one aggregatedList, filtered server-side by
    label and checked again here)."""
    from google.cloud import compute_v1

    managed = f"labels.{naming.MANAGED_LABEL}={naming.label_value(prefix)}"
    request = compute_v1.AggregatedListInstancesRequest(
        project=ctx.project, filter=f"{managed} AND labels.{naming.ROLE_LABEL}={ROLE}"
    )
    for scope, scoped in ctx.instances.aggregated_list(request=request):
        for inst in scoped.instances:
            labels = dict(inst.labels)
            if is_ours(labels, prefix):
                yield ManagedInstance(name=inst.name, zone=scope.rsplit("/", 1)[-1], labels=labels)
