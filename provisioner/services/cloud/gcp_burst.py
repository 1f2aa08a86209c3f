"""Burst VMs: a job worker placed on GCP capacity gets its own ephemeral VM (docs/gcp.md "Burst compute
for jobs"). This module is the store side; reconcilers/gcp_burst.py calls Google.

- `materialise` (called by services.jobs when placement chose a GCP candidate): books the region's
  capacity (services.gcp_capacity.book), then writes, in the placing transaction, a `nodes` row named
  like the VM (state new, the placeholder minion_id of a VM whose EK is not known yet) and a
  `gcp_burst_vms` row (pending) per worker; the worker is assigned to that node like to any node, so the
  VM's minion takes the job from its desired state once it joins. The rows exist BEFORE any insert call,
  and the insert's requestId derives from the row's id: exactly one VM per row, whenever we crash.
- `wanted`: a VM is kept while a worker of its job is on its node; otherwise (the job ended, stopped,
  was re-queued) the reconciler deletes it.
Preemption (Google took a Spot VM back) is services/jobs/gcp_preemption.py.

Permanent compute nodes (`provision node add NAME --region R --gpu-type T [--gpu-count N] [--reservation
RES]`, `add_compute_node`) are the same rows without a job: an on-demand VM (in a Compute reservation
when one is named: committed capacity) that the same reconciler creates, whose EK is pinned the same way,
and that joins and goes to maintenance like a physical node. It is kept until its node is removed."""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from contracts.errors import InvalidInput, RuleViolation
from contracts.jobspec import JobSpec
from provisioner.domain.placement import Candidate, CandidateSource
from provisioner.domain.states import (
    BURST_VM_TRANSITIONS,
    JOB_DONE,
    NODE_TRANSITIONS,
    WORKER_ON_NODE,
    BurstVmState,
    JobState,
    NodeState,
    Service,
    WorkerState,
)
from provisioner.providers.base import Feature
from provisioner.providers.gcp import catalogue, naming
from provisioner.providers.gcp.compute_node import local_ssds_for
from provisioner.services.cloud import gcp_capacity
from provisioner.services.common import lifecycle, names
from provisioner.services.common.runtime import runtime_of
from provisioner.services.common.wakeups import Wake, wake_after_commit
from provisioner.services.fleet import join_tokens
from provisioner.services.fleet import nodes as node_service
from provisioner.services.regions import regions as region_service
from provisioner.store.gcp_models import GcpBurstVm
from provisioner.store.job_models import Job
from provisioner.store.models import Node, Region, new_id

KIND = "burst_vm"  # audit kind of a burst VM's state changes
_RESERVATION = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")  # Compute's resource name rule


def move(session: Session, vm: GcpBurstVm, to: BurstVmState, *, actor: str, reason: str | None) -> None:
    """The only way a burst VM's state changes: checked against BURST_VM_TRANSITIONS, audited; `reason`
    stays on the row as its last progress line."""
    if vm.state != to.value:
        lifecycle.apply(
            session,
            vm,
            to,
            kind=KIND,
            name=vm.instance_name,
            table=BURST_VM_TRANSITIONS,
            actor=actor,
            reason=reason,
            resource_id=vm.id,
        )
    vm.reason = reason


def pending_minion_id(vm_id: str) -> str:
    """A placeholder until the vTPM's EK is pinned (see services.gcp.pending_minion_id)."""
    return hashlib.sha256(f"rigbase-gcp-burst-pending:{vm_id}".encode()).hexdigest()[:32]


def instance_name(prefix: str, vm_id: str) -> str:
    return naming.gcp_name(prefix, "burst", vm_id.split("_", 1)[-1])


def materialise(
    session: Session, job: Job, placed: Sequence[tuple[int, Candidate]], *, actor: str
) -> tuple[list[tuple[int, Candidate]], str | None]:
    """`placed` (worker number, candidate) with every GCP candidate replaced by the node of a new burst VM
    (module docstring), or (placed, why) when the region's capacity is gone since the snapshot: then
    nothing is written."""
    on_gcp = [(at, w, c) for at, (w, c) in enumerate(placed) if c.source == CandidateSource.GCP]
    if not on_gcp:
        return list(placed), None
    for cid, workers in Counter(c.id for _, _, c in on_gcp).items():
        region_id, gpu, spot = gcp_capacity.parse_candidate_id(cid)
        why = gcp_capacity.book(session, region_id, gpu, workers, spot)
        if why is not None:
            return list(placed), why
    out = list(placed)
    attempt = job.placements + 1
    plan = JobSpec.model_validate(job.spec).plan()
    for at, index, cand in on_gcp:
        disk_gb = plan[index].resources.disk_size
        node = _make(session, job, index, cand, attempt=attempt, disk_gb=disk_gb, actor=actor)
        out[at] = (index, replace(cand, source=CandidateSource.NODE.value, id=node.id, name=node.name))
    session.flush()
    wake_after_commit(session, Wake.GCP_BURST)
    return out, None


def _make(
    session: Session, job: Job, index: int, cand: Candidate, *, attempt: int, disk_gb: int, actor: str
) -> Node:
    region_id, gpu_name, spot = gcp_capacity.parse_candidate_id(cand.id)
    region = session.get_one(Region, region_id)
    gpu = catalogue.load().gpus[gpu_name]
    prefix = str((region.settings or {}).get("prefix") or naming.DEFAULT_PREFIX)
    vm_id = new_id("bvm")
    name = instance_name(prefix, vm_id)
    model = "Spot" if spot else "on-demand"
    node = node_service.add_vm_node(
        session,
        region,
        name,
        minion_id=pending_minion_id(vm_id),
        service=Service.COMPUTE,
        actor=actor,
        reason=f"{model} {gpu.machine_type} VM for job {job.name} worker {index}: the gcp-burst reconciler "
        "creates it; its minion_id comes from the vTPM's endorsement key",
    )
    _row, token = join_tokens.issue(session, region.id, actor=actor)
    vm = GcpBurstVm(
        id=vm_id,
        job_id=job.id,
        worker_index=index,
        attempt=attempt,
        node_id=node.id,
        region_id=region.id,
        instance_name=name,
        gpu_type=gpu.name,
        gpu_count=1,
        cpus=gpu.cpus_per_gpu,
        local_ssds=local_ssds_for(disk_gb),
        preemptible=spot,
        price_per_gpu_hour=cand.price_per_gpu_hour,
        sealed_join_token=runtime_of(session).sealer.seal(token.encode()),
    )
    session.add(vm)
    move(session, vm, BurstVmState.PENDING, actor=actor, reason=f"{model} {gpu.name} VM for job {job.name}")
    return node


def add_compute_node(
    session: Session,
    name: str,
    *,
    region: str,
    gpu_type: str,
    gpu_count: int = 1,
    reservation: str | None = None,
    dry_run: bool = False,
    actor: str,
) -> dict[str, Any]:
    """A permanent compute node on a VM of the GCP region (module docstring): the node (new, the
    placeholder minion_id until the EK is pinned) and its VM row (pending), or with dry_run what it would
    make and cost. Every check runs before the first write."""
    names.dns_label("node", name)
    reg = region_service.get(session, region)
    if not runtime_of(session).provider(reg.provider.kind).supports(Feature.VMS):
        raise RuleViolation(
            f"region '{reg.name}' is a {reg.provider.kind} region: --gpu-type adds a VM to a GCP region; "
            "add your own machines with --minion-id",
            code="gpu_type_needs_gcp_region",
        )
    if reservation is not None and not _RESERVATION.fullmatch(reservation):
        raise InvalidInput(
            f"--reservation '{reservation}' is not a Compute reservation name (lowercase letters, digits "
            "and '-', 1-63 characters, starting with a letter)"
        )
    cat = catalogue.load()
    gpu = cat.gpus.get(gpu_type)
    gcp_region = str((reg.settings or {}).get("gcp_region") or reg.name)
    zones = cat.region(gcp_region).gpu_zones.get(gpu_type, ()) if gpu else ()
    if gpu is None or not zones:
        offered = sorted(g for g, z in cat.region(gcp_region).gpu_zones.items() if z)
        raise InvalidInput(
            f"--gpu-type {gpu_type}: {gcp_region} offers {', '.join(offered)} (regions/gcp-gpus.yaml)"
        )
    machine_type, cpus = gpu.machine_for(gpu_count)
    node_service.refuse_node_name_taken(session, reg, name)
    node_service.refuse_compute_without_active_storage(reg, node_service.storage_node(session, reg))
    plan = {
        "dry_run": dry_run,
        "name": name,
        "region": reg.name,
        "machine_type": machine_type,
        "gpu_type": gpu.name,
        "gpu_count": gpu_count,
        "zones": list(zones),
        "reservation": reservation,
        "price_per_hour": None if reservation else round(gpu.price_per_gpu_hour * gpu_count, 4),
        "billing": "the reservation's committed price" if reservation else "on demand, by the second",
    }
    if not reservation:  # a reservation holds its own capacity; on demand spends the region's quota
        why = gcp_capacity.book(session, reg.id, gpu.name, gpu_count)
        if why is not None:
            raise RuleViolation(
                f"GCP {gcp_region} has no capacity for {gpu_count} {gpu.name}: {why}; request more quota or "
                "name a reservation with --reservation",
                code="gcp_no_capacity",
            )
    if dry_run:
        session.rollback()  # the booking above only checked
        return plan
    prefix = str((reg.settings or {}).get("prefix") or naming.DEFAULT_PREFIX)
    vm_id = new_id("bvm")
    node = node_service.add_vm_node(
        session,
        reg,
        name,
        minion_id=pending_minion_id(vm_id),
        service=Service.COMPUTE,
        actor=actor,
        reason=f"{machine_type} VM with {gpu_count} × {gpu.name}"
        + (f" in reservation {reservation}" if reservation else " on demand")
        + ": the gcp-burst reconciler creates it; its minion_id comes from the vTPM's endorsement key",
    )
    _row, token = join_tokens.issue(session, reg.id, actor=actor)
    vm = GcpBurstVm(
        id=vm_id,
        job_id=None,
        worker_index=0,
        attempt=0,
        node_id=node.id,
        region_id=reg.id,
        instance_name=naming.gcp_name(prefix, reg.name, name),
        gpu_type=gpu.name,
        gpu_count=gpu_count,
        cpus=cpus,
        local_ssds=1,  # the scratch volume finalize makes
        preemptible=False,
        reservation=reservation,
        price_per_gpu_hour=gpu.price_per_gpu_hour,
        sealed_join_token=runtime_of(session).sealer.seal(token.encode()),
    )
    session.add(vm)
    move(session, vm, BurstVmState.PENDING, actor=actor, reason=f"compute node {name}: {machine_type}")
    session.flush()
    wake_after_commit(session, Wake.GCP_BURST)
    return {**plan, "node": node, "vm_id": vm.id, "instance": vm.instance_name}


def wanted(session: Session, vm: GcpBurstVm) -> str | None:
    """None while a worker of the VM's job is on its node (a permanent node's VM: while the node is not
    removed); otherwise why the VM should go."""
    if vm.job_id is None:
        node = session.get(Node, vm.node_id)
        if node is None or node.state == NodeState.REMOVED:
            return f"its node {node.name if node else vm.node_id} was removed"
        return None
    job = session.get(Job, vm.job_id)
    if job is None or JobState(job.state) in JOB_DONE:
        return f"job {job.name if job else vm.job_id} ended ({job.state if job else 'gone'})"
    node = session.get(Node, vm.node_id)
    if node is None or node.state == NodeState.REMOVED:
        return f"its node {vm.instance_name} was removed"
    if not any(w.node_id == vm.node_id and WorkerState(w.state) in WORKER_ON_NODE for w in job.workers):
        return f"job {job.name} no longer runs on it ({job.state})"
    return None


def retire_node(session: Session, vm: GcpBurstVm, *, actor: str, reason: str) -> None:
    """The VM is gone: its node is removed (a burst node is never reused) and the join token it was made
    with is revoked, so the token (readable from the VM's metadata while it ran) enrols nothing else."""
    node = session.get(Node, vm.node_id)
    if node is not None and NodeState.REMOVED in NODE_TRANSITIONS[NodeState(node.state)]:
        node_service.transition(session, node, NodeState.REMOVED, actor=actor, reason=reason)
    token = runtime_of(session).sealer.unseal(vm.sealed_join_token).decode()
    join_tokens.revoke_issued(session, token, actor=actor, reason=f"burst VM {vm.instance_name} is gone")


def live_by_instance(session: Session, name: str) -> GcpBurstVm | None:
    return session.scalar(
        select(GcpBurstVm).where(
            GcpBurstVm.instance_name == name,
            GcpBurstVm.state.in_([BurstVmState.PENDING, BurstVmState.CREATING, BurstVmState.CREATED]),
        )
    )
