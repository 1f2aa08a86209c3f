"""The gcp-burst reconciler: the Google side of burst VMs (services/cloud/gcp_burst.py is the store side).

Each pass (every 3 s, and at once when a job is placed on GCP):
1. each live burst VM moves along BURST_VM_TRANSITIONS: pending → creating (written BEFORE the insert
   call) → created (VM made, zone fallback inside compute_node.create; its vTPM EK pinned on its node);
   every zone refusing → failed, and the job goes back to `waiting` with the zones' reasons; a VM its job
   no longer runs on (ended, stopped, re-queued) → deleting → deleted, its node removed;
2. quota: every GCP region's quota read again when the cached one is older than QUOTA_MAX_AGE_S, so
   placement (services.gcp_capacity) always has a recent one without calling Google itself (after the
   VMs, so a job's insert never waits behind the reads);
3. the reaper (every REAP_PERIOD_S): a VM carrying our burst labels that no live VM row owns is deleted
   with an audit line. Instances are listed BEFORE the rows are read: a row is committed before its
   insert is sent, so a VM the list shows always has its row in the read that follows.

Every step reads the store, calls Google outside any transaction, and records the outcome in a short unit
of work: a control plane killed anywhere resumes from the store, and the requestId (derived from the row)
makes a resumed insert return the first one's operation."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from cryptography.hazmat.primitives import serialization
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from contracts.errors import RigbaseError
from contracts.identity import minion_id_from_spki
from provisioner.domain.states import BURST_VM_LIVE, BurstVmState, NodeState, ProviderState
from provisioner.providers.base import ProvisionFailed
from provisioner.providers.gcp import GcpContext, compute_node, naming, quota
from provisioner.reconcilers.loop import register
from provisioner.services.cloud import gcp, gcp_burst, gcp_capacity, image_publish
from provisioner.services.common import audit
from provisioner.services.common.runtime import runtime_of
from provisioner.services.common.wakeups import Wake
from provisioner.services.fleet import nodes as node_service
from provisioner.services.jobs import jobs
from provisioner.store.engine import session_scope
from provisioner.store.gcp_models import GcpBurstVm, GcpQuotaCache
from provisioner.store.job_models import Job
from provisioner.store.models import Node, Provider, Region

log = logging.getLogger("rigbase.gcp.burst")
ACTOR = "reconciler:gcp-burst"
QUOTA_MAX_AGE_S = 60.0
REAP_PERIOD_S = 60.0
REASON_MAX = 500


@dataclass
class _Clock:
    last_reap: float = float("-inf")


_clock = _Clock()


@register(Wake.GCP_BURST, period_s=3.0)
def burst_step(sessions: sessionmaker[Session]) -> None:
    ctx, prefix = _context(sessions)
    if ctx is None:
        return
    with session_scope(sessions) as s:
        ids = list(
            s.scalars(
                select(GcpBurstVm.id)
                .where(GcpBurstVm.state.in_([st.value for st in BURST_VM_LIVE]))
                .order_by(GcpBurstVm.created_at)
            )
        )
    for vm_id in ids:
        try:
            reconcile_vm(sessions, ctx, vm_id)
        except Exception:
            log.exception("burst VM %s: pass failed, retrying next pass", vm_id)
    refresh_quotas(sessions, ctx)  # after the VMs: a job's insert never waits behind ten quota reads
    if time.monotonic() - _clock.last_reap >= REAP_PERIOD_S:
        _clock.last_reap = time.monotonic()
        reap(sessions, ctx, prefix)


def _context(sessions: sessionmaker[Session]) -> tuple[GcpContext | None, str]:
    with session_scope(sessions) as s:
        prov = s.scalar(
            select(Provider).where(Provider.kind == gcp.KIND, Provider.state == ProviderState.ENABLED)
        )
        if prov is None:
            return None, naming.DEFAULT_PREFIX
        prefix = str(prov.public_config.get("prefix") or naming.DEFAULT_PREFIX)
        return gcp.context_of(s, prov), prefix


# --- 2. quota cache ------------------------------------------------------------------------------------


def refresh_quotas(
    sessions: sessionmaker[Session], ctx: GcpContext, *, max_age_s: float = QUOTA_MAX_AGE_S
) -> None:
    now = datetime.now(UTC)
    with session_scope(sessions) as s:
        ages = gcp_capacity.cache_age_s(s, now)
        stale = [
            (v.region_id, v.gcp_region)
            for v in gcp_capacity.regions(s)
            if ages.get(v.name) is None or (ages[v.name] or 0.0) >= max_age_s
        ]
        cat = gcp.driver(s).catalogue()
    for region_id, gcp_region in stale:
        try:
            read = quota.fetch(ctx, gcp_region, cat)
        except Exception as exc:
            with session_scope(sessions) as s:
                row = s.get(GcpQuotaCache, region_id) or GcpQuotaCache(
                    region_id=region_id, quotas={}, bookings=0
                )
                row.error = _one_line(_describe(exc))
                s.add(row)
            continue
        with session_scope(sessions) as s:
            gcp_capacity.store_quotas(s, region_id, read.quotas, datetime.now(UTC))


# --- 1. each VM ------------------------------------------------------------------------------------------


def reconcile_vm(sessions: sessionmaker[Session], ctx: GcpContext, vm_id: str) -> None:
    with session_scope(sessions) as s:
        vm = s.get_one(GcpBurstVm, vm_id)
        state = BurstVmState(vm.state)
        gone = gcp_burst.wanted(s, vm)
        if gone is not None and state != BurstVmState.DELETING:
            gcp_burst.move(s, vm, BurstVmState.DELETING, actor=ACTOR, reason=f"deleting: {gone}")
            state = BurstVmState.DELETING
        elif state == BurstVmState.PENDING:
            # recorded before the insert: a crash after this line resumes with the same requestId
            gcp_burst.move(s, vm, BurstVmState.CREATING, actor=ACTOR, reason=f"creating {vm.instance_name}")
            state = BurstVmState.CREATING
        spec = _spec(s, vm)
        pinned = s.get_one(Node, vm.node_id).pinned_ek_public is not None
    if state == BurstVmState.DELETING:
        _delete(sessions, ctx, vm_id, spec.zones)
    elif state == BurstVmState.CREATING:
        _create(sessions, ctx, vm_id, spec)
    elif state == BurstVmState.CREATED and not pinned:
        _pin_ek(sessions, ctx, vm_id)


def _spec(session: Session, vm: GcpBurstVm) -> compute_node.ComputeNodeSpec:
    region = session.get_one(Region, vm.region_id)
    cat = gcp.driver(session).catalogue()
    gcp_region = str((region.settings or {}).get("gcp_region") or region.name)
    gpu = cat.gpus[vm.gpu_type]
    zones = cat.region(gcp_region).gpu_zones.get(gpu.name, ())
    token = runtime_of(session).sealer.unseal(vm.sealed_join_token).decode()
    return compute_node.ComputeNodeSpec(
        vm_id=vm.id,
        instance_name=vm.instance_name,
        job_id=vm.job_id or "",
        region_id=region.id,
        region=region.name,
        gcp_region=gcp_region,
        zones=tuple(zones),
        gpu=gpu,
        gpu_count=vm.gpu_count,
        local_ssds=vm.local_ssds,
        preemptible=vm.preemptible,
        bundle=gcp.enrollment_bundle(session, region, token),
        prefix=str((region.settings or {}).get("prefix") or naming.DEFAULT_PREFIX),
        image=image_publish.source_image(session, region) or "",
        reservation=vm.reservation,
        node_name=session.get_one(Node, vm.node_id).name,
    )


def _create(
    sessions: sessionmaker[Session], ctx: GcpContext, vm_id: str, spec: compute_node.ComputeNodeSpec
) -> None:
    try:
        made = compute_node.create(ctx, spec)
    except ProvisionFailed as exc:
        _fail(sessions, vm_id, exc.message)
        return
    with session_scope(sessions) as s:
        vm = s.get_one(GcpBurstVm, vm_id)
        if BurstVmState(vm.state) != BurstVmState.CREATING:
            return  # the job ended meanwhile: the next pass deletes what we just made
        vm.zone, vm.inserted_at = made.zone, datetime.now(UTC)
        gcp_burst.move(
            s,
            vm,
            BurstVmState.CREATED,
            actor=ACTOR,
            reason=f"{'adopted' if made.adopted else 'created'} {made.name} in {made.zone}",
        )
    _pin_ek(sessions, ctx, vm_id)


def _fail(sessions: sessionmaker[Session], vm_id: str, reason: str) -> None:
    """Every zone refused: the VM row fails, its node is removed and the job waits again with the reason
    (services.gcp_capacity keeps that region's type at 0 free for a while, so it is not asked again at
    once)."""
    with session_scope(sessions) as s:
        vm = s.get_one(GcpBurstVm, vm_id)
        if BurstVmState(vm.state) != BurstVmState.CREATING:
            return
        gcp_burst.move(s, vm, BurstVmState.FAILED, actor=ACTOR, reason=reason)
        node = s.get_one(Node, vm.node_id)
        if vm.job_id is None:
            # a permanent node: the operator sees why on the node and removes it (then adds it again)
            node_service.transition(
                s, node, NodeState.ERRORED, actor=ACTOR, reason=f"{reason}; remove the node and add it again"
            )
            return
        job = s.get_one(Job, vm.job_id)
        jobs.requeue_or_fail(s, job, node, why=reason, actor=ACTOR)
        gcp_burst.retire_node(s, vm, actor=ACTOR, reason=reason)


def _pin_ek(sessions: sessionmaker[Session], ctx: GcpContext, vm_id: str) -> None:
    """Pin the vTPM's EK on the VM's node and derive its minion_id (as for a storage node), so the VM's
    minion is recognised when it joins."""
    with session_scope(sessions) as s:
        vm = s.get_one(GcpBurstVm, vm_id)
        if BurstVmState(vm.state) != BurstVmState.CREATED or vm.zone is None:
            return
        made = compute_node.ComputeNode(name=vm.instance_name, zone=vm.zone, adopted=True, status="")
    pem = compute_node.ek_public(ctx, made)
    key = serialization.load_pem_public_key(pem.encode())
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    with session_scope(sessions) as s:
        vm = s.get_one(GcpBurstVm, vm_id)
        if BurstVmState(vm.state) != BurstVmState.CREATED:
            return
        node = node_service.lock(s, s.get_one(Node, vm.node_id))
        node.pinned_ek_public = der
        node.minion_id = minion_id_from_spki(der)
        vm.reason = f"ready: {vm.instance_name} in {vm.zone} waits to join as minion {node.minion_id}"


def _delete(sessions: sessionmaker[Session], ctx: GcpContext, vm_id: str, zones: tuple[str, ...]) -> None:
    with session_scope(sessions) as s:
        vm = s.get_one(GcpBurstVm, vm_id)
        name, zone = vm.instance_name, vm.zone
    # the zone it was made in first, then the others (a crash between insert and record leaves it unknown)
    order = tuple(dict.fromkeys([z for z in (zone,) if z] + list(zones)))
    deleted = compute_node.delete(ctx, name, order)
    with session_scope(sessions) as s:
        vm = s.get_one(GcpBurstVm, vm_id)
        why = vm.reason or ("its node was removed" if vm.job_id is None else "its job ended")
        gcp_burst.move(
            s,
            vm,
            BurstVmState.DELETED,
            actor=ACTOR,
            reason=f"{'deleted' if deleted else 'no VM to delete:'} {name} ({why})",
        )
        gcp_burst.retire_node(s, vm, actor=ACTOR, reason=f"VM {name} deleted: {why}")


# --- 3. the reaper --------------------------------------------------------------------------------------


def reap(sessions: sessionmaker[Session], ctx: GcpContext, prefix: str) -> list[str]:
    """Delete VMs with our burst labels that no live VM row owns (module docstring); returns their names.
    Anything without our labels is never listed as ours (compute_node.is_ours)."""
    found = list(compute_node.managed_instances(ctx, prefix))  # listed FIRST: see the module docstring
    if not found:
        return []
    with session_scope(sessions) as s:
        owned = set(
            s.scalars(
                select(GcpBurstVm.instance_name).where(
                    GcpBurstVm.instance_name.in_([i.name for i in found]),
                    GcpBurstVm.state.in_([st.value for st in BURST_VM_LIVE]),
                )
            )
        )
    reaped: list[str] = []
    for inst in found:
        if inst.name in owned:
            continue
        try:
            compute_node.delete(ctx, inst.name, (inst.zone,))
        except Exception:
            log.exception("reaping %s failed; retrying next pass", inst.name)
            continue
        reaped.append(inst.name)
        with session_scope(sessions) as s:
            audit.note(
                s,
                kind=gcp_burst.KIND,
                resource_id=inst.labels.get(compute_node.BURST_VM_LABEL) or inst.name,
                name=inst.name,
                actor=ACTOR,
                state=BurstVmState.DELETED.value,
                reason=f"reaped: {inst.name} in {inst.zone} carries rigbase's burst labels (job "
                f"{inst.labels.get(compute_node.JOB_LABEL, '?')}) but no live job or node owns it",
            )
        log.warning("reaped stray burst VM %s in %s", inst.name, inst.zone)
    return reaped


def _describe(exc: Exception) -> str:
    if isinstance(exc, RigbaseError):
        return exc.message
    return f"{type(exc).__name__}: {getattr(exc, 'message', None) or exc}"


def _one_line(text: str) -> str:
    return " ".join(text.split())[:REASON_MAX]
