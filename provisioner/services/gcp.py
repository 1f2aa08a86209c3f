"""The Google Cloud provider in the control plane: enable (with permission check), quota, region create
(with capacity check and the storage node record), and the reconciler steps that do the slow work —
project bootstrap/teardown, the storage node's VM, region health — plus turning node events into state.

The library (provisioner/providers/gcp/) talks to Google; this module decides what the store says.
Every slow step is a reconciler step that reads the store, calls Google outside any transaction, and
records the outcome in a short unit of work, so a control plane killed anywhere resumes from the store.

How "offline" maps onto the state tables: `online` is derived from heartbeats and the node lifecycle
(new … active) describes the node's software, not whether its VM runs. So a stopped or preempted
storage node moves its REGION to `offline` with the reason (the region cannot serve without it), and
`gcp_storage_nodes.running` records what Compute said; the node itself keeps its lifecycle state and
shows offline by itself once its heartbeats stop. When the VM runs again and the node is active, the
health step moves the region back to healthy. A VM deleted behind rigbase's back makes the node and
the region `errored` with that reason."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from provisioner.config import client_config_path
from provisioner.errors import Conflict, RigbaseError, RuleViolation
from provisioner.providers.base import ProviderConfig
from provisioner.providers.gcp import GcpProvider, naming, permissions, quota
from provisioner.providers.gcp import storage_node as vm
from provisioner.secrets import seal, unseal
from provisioner.services import nodes as node_service
from provisioner.services import providers as provider_service
from provisioner.services import regions as region_service
from provisioner.states import ONLINE_WINDOW, NodeState, ProviderState, RegionState, Service, StorageMode, is_online
from provisioner.store.engine import session_scope
from provisioner.store.gcp_models import VM_TRANSITIONS, GcpBootstrap, GcpStorageNode, VmStatus
from provisioner.store.models import Node, Provider, Region, new_id

if TYPE_CHECKING:  # pragma: no cover
    from provisioner.providers.gcp.clients import GcpContext
    from provisioner.providers.gcp.events import NodeEvent

log = logging.getLogger("rigbase.gcp")
KIND = "gcp"
ACTOR = "reconciler:gcp"
PUBLIC_URL_ENV = "RIGBASE_PUBLIC_URL"  # the control-plane URL nodes dial (written into bundles)


# --- provider ----------------------------------------------------------------------------------


def config_of(provider: Provider) -> ProviderConfig:
    """The stored configuration with the key unsealed (never leaves this process)."""
    secret = unseal(provider.sealed_config) if provider.sealed_config else None
    return ProviderConfig(payment_mode=provider.payment_mode, public=dict(provider.public_config or {}), secret=secret)


def context_of(provider: Provider) -> GcpContext:
    return GcpProvider.context(config_of(provider))


def enabled_provider(session: Session) -> Provider:
    prov = provider_service.get(session, KIND)
    if prov.state != ProviderState.ENABLED:
        raise Conflict(f"provider 'gcp' is {prov.state}, not enabled: wait for it (`provision provider show gcp`) "
                       f"or see its reason", code="provider_not_enabled")
    return prov


def enable(session: Session, raw: Mapping[str, Any], *, dry_run: bool, actor: str) -> dict[str, Any]:
    """Validate the key (no network), check permissions (testIamPermissions), then — unless dry_run —
    record the provider `new`; the bootstrap reconciler creates the project resources and enables it.
    Refusals store nothing."""
    impl = GcpProvider()
    config = impl.validate_config(raw)
    if not dry_run and session.scalar(select(Provider.id).where(Provider.kind == KIND, Provider.state != ProviderState.REMOVED)):
        raise Conflict("provider 'gcp' is already enabled: see `provision provider show gcp`")
    report = permissions.check(impl.context(config))
    email = config.public["client_email"]
    if report.checked and report.missing_roles:
        raise RuleViolation(report.message(email), code="missing_roles")
    out: dict[str, Any] = {
        "dry_run": dry_run,
        "project_id": config.public["project_id"],
        "client_email": email,
        "prefix": config.public["prefix"],
        "permissions": {"checked": report.checked, "missing_roles": list(report.missing_roles), "message": report.message(email)},
        "plan": [asdict(a) for a in impl.plan_enable(config)],
        "provider": None,
    }
    if dry_run:
        return out
    provider = provider_service.enable(session, KIND, raw, actor=actor)
    session.add(GcpBootstrap(provider_id=provider.id, progress="waiting for the bootstrap reconciler", created=[]))
    out["provider"] = provider
    return out


def bootstrap_status(session: Session) -> dict[str, Any]:
    """The provider and its bootstrap/teardown progress: what `provider enable gcp --wait` shows."""
    prov = provider_service.get(session, KIND)
    row = session.get(GcpBootstrap, prov.id)
    return {"provider": prov, "progress": row.progress if row else None, "created": list(row.created) if row else []}


def bootstrap_step(sessions: sessionmaker[Session]) -> None:
    """Reconciler step: bootstrap `new` gcp providers (→ enabled / errored), tear down `removing` ones."""
    from provisioner.providers.gcp import bootstrap

    with session_scope(sessions) as s:
        todo = [(p.id, p.state) for p in s.scalars(select(Provider).where(
            Provider.kind == KIND, Provider.state.in_([ProviderState.NEW, ProviderState.REMOVING])))]
    for provider_id, state in todo:
        with session_scope(sessions) as s:
            prov = s.get(Provider, provider_id)
            ctx, names = context_of(prov), GcpProvider.names(config_of(prov))
        say = _progress_saver(sessions, provider_id)
        try:
            if state == ProviderState.NEW:
                made = bootstrap.apply(ctx, names, on_progress=say)
                _finish_provider(sessions, provider_id, ProviderState.NEW, ProviderState.ENABLED,
                                 f"bootstrap complete ({len(made)} created)", made=[f"{a.kind} {a.name}" for a in made])
            else:
                gone = bootstrap.teardown(ctx, names, on_progress=say)
                _finish_provider(sessions, provider_id, ProviderState.REMOVING, ProviderState.REMOVED,
                                 f"teardown complete ({len(gone)} deleted)")
        except Exception as exc:  # noqa: BLE001 - any failure is the provider's reason, retried on `remove`
            reason = _one_line(f"{'bootstrap' if state == ProviderState.NEW else 'teardown'} failed: {_describe(exc)}")
            log.warning("gcp provider %s: %s", provider_id, reason)
            _finish_provider(sessions, provider_id, state, ProviderState.ERRORED, reason)


def _progress_saver(sessions: sessionmaker[Session], provider_id: str) -> Callable[[str], None]:
    def save(line: str) -> None:
        with session_scope(sessions) as s:
            row = s.get(GcpBootstrap, provider_id) or GcpBootstrap(provider_id=provider_id, created=[])
            row.progress = line
            s.add(row)

    return save


def _finish_provider(sessions: sessionmaker[Session], provider_id: str, expected: ProviderState,
                     to: ProviderState, note: str, made: list[str] | None = None) -> None:
    with session_scope(sessions) as s:
        prov = s.get(Provider, provider_id)
        if prov is None or prov.state != expected:
            return  # the operator changed it meanwhile (e.g. remove during bootstrap): next pass decides
        provider_service.transition(s, prov, to, actor=ACTOR, reason=note)
        row = s.get(GcpBootstrap, provider_id)
        if row is not None:
            row.progress = note
            if made:
                row.created = [*row.created, *made]


# --- quota ---------------------------------------------------------------------------------------


def region_quota(session: Session, gcp_region: str) -> quota.RegionQuota:
    ctx = context_of(enabled_provider(session))
    return quota.fetch(ctx, gcp_region)


# --- regions ---------------------------------------------------------------------------------------


def storage_node_name(prefix: str, region: str) -> str:
    """The node's name is its VM's name, so `node list` and the Cloud console agree."""
    return naming.gcp_name(prefix, "storage", region)


def pending_minion_id(region_id: str) -> str:
    """A placeholder until the vTPM's EK is known (minion_id is derived from the EK): unique per region,
    and never a real minion's id (no EK hashes to a value we choose)."""
    return hashlib.sha256(f"rigbase-gcp-pending:{region_id}".encode()).hexdigest()[:32]


def create_region(session: Session, name: str, *, gcp_region: str | None, storage_class: str, public_jobs: bool,
                  dry_run: bool, actor: str) -> dict[str, Any]:
    """Refuse regions outside the catalogue or without GPU capacity; record the region (central storage)
    and its storage node (`new`, VM status pending). The storage-node reconciler makes the VM."""
    from provisioner.services import names

    names.dns_label("region", name)
    prov = enabled_provider(session)
    impl = GcpProvider()
    options = {"gcp_region": gcp_region or name, "storage_class": storage_class}
    settings = impl.validate_region(name, options)  # refuses regions outside the catalogue
    prefix = prov.public_config.get("prefix", naming.DEFAULT_PREFIX)
    rq = quota.fetch(context_of(prov), settings["gcp_region"])
    if not rq.runnable:
        raise RuleViolation(rq.why_not_runnable(), code="no_gpu_capacity")
    out: dict[str, Any] = {
        "dry_run": dry_run,
        "quota": rq.to_json(),
        "plan": [asdict(a) for a in impl.plan_region(name, {**settings, "prefix": prefix})],
        "region": None,
        "node": None,
    }
    if dry_run:
        return out
    region = region_service.create(session, name, provider=prov.id, storage_mode=StorageMode.CENTRAL.value,
                                   public_jobs=public_jobs, options=options, actor=actor)
    region.settings = {**region.settings, "prefix": prefix}
    node = Node(id=new_id("node"), name=storage_node_name(prefix, name), region=region,
                minion_id=pending_minion_id(region.id), service=Service.STORAGE.value, upnp=False, mining=False)
    session.add(node)
    node_service.transition(session, node, NodeState.NEW, actor=actor,
                            reason="storage node of a GCP region: the reconciler creates its VM; "
                                   "its minion_id comes from the vTPM's endorsement key")
    from provisioner.services import join_tokens

    _row, token = join_tokens.issue(session, region.id, actor=actor)  # verified by the join like any bundle's
    session.add(GcpStorageNode(region_id=region.id, node_id=node.id, instance_name=node.name,
                               gcp_region=settings["gcp_region"], status=VmStatus.PENDING.value, running=False,
                               progress="waiting for the storage-node reconciler", sealed_join_token=seal(token.encode())))
    out["region"], out["node"] = region, node
    return out


def enrollment_bundle(session: Session, region: Region, join_token: str) -> dict[str, Any]:
    """The storage node's bundle (docs/enrollment-bundle.md): built by the one bundle function, with
    the URL that VMs in Google Cloud can reach."""
    from provisioner.services import join_tokens

    return join_tokens.bundle(session, region, join_token, control_plane_url=control_plane_url())


def control_plane_url() -> str:
    """$RIGBASE_PUBLIC_URL (what VMs in Google Cloud can reach), else the URL `provision serve` wrote."""
    if os.environ.get(PUBLIC_URL_ENV):
        return os.environ[PUBLIC_URL_ENV]
    try:
        return json.loads(client_config_path().read_text())["url"]
    except (OSError, ValueError, KeyError):
        return "http://127.0.0.1:8470"


def storage_status(session: Session, ref: str) -> dict[str, Any]:
    """Region, its storage node and the VM's progress: what `region create --wait` shows."""
    region = region_service.get(session, ref, KIND)
    rec = session.get(GcpStorageNode, region.id)
    node = session.get(Node, rec.node_id) if rec else None
    vm_out = None
    if rec is not None:
        vm_out = {"instance": rec.instance_name, "zone": rec.zone, "status": rec.status, "running": rec.running,
                  "progress": rec.progress, "error": rec.error}
    return {"region": region, "node": node, "vm": vm_out}


# --- storage-node reconciler ---------------------------------------------------------------------------


def _set_status(rec: GcpStorageNode, to: VmStatus, progress: str | None = None) -> None:
    current = VmStatus(rec.status)
    if to != current and to not in VM_TRANSITIONS[current]:
        raise RuleViolation(f"storage VM {rec.instance_name} is {current.value} and cannot go to {to.value}")
    rec.status = to.value
    if progress is not None:
        rec.progress = progress


def _spec(session: Session, region: Region, rec: GcpStorageNode) -> vm.StorageNodeSpec:
    token = unseal(rec.sealed_join_token).decode()
    settings = region.settings or {}
    return GcpProvider.storage_node_spec(region.id, region.name, settings, enrollment_bundle(session, region, token),
                                         prefix=settings.get("prefix", naming.DEFAULT_PREFIX))


def storage_nodes_step(sessions: sessionmaker[Session]) -> None:
    """Reconciler step: drive every GCP storage node towards what its region wants."""
    with session_scope(sessions) as s:
        ids = list(s.scalars(select(GcpStorageNode.region_id).where(GcpStorageNode.status != VmStatus.DELETED.value)))
    for region_id in ids:
        try:
            _reconcile_one(sessions, region_id)
        except Exception:  # noqa: BLE001 - one region's failure must not stop the others
            log.exception("gcp storage node of region %s: pass failed, retrying next pass", region_id)


def _reconcile_one(sessions: sessionmaker[Session], region_id: str) -> None:
    with session_scope(sessions) as s:
        rec = s.get(GcpStorageNode, region_id)
        region = s.get(Region, region_id)
        node = s.get(Node, rec.node_id)
        status = VmStatus(rec.status)
        leaving = region.state in (RegionState.REMOVING, RegionState.REMOVED) or node.state == NodeState.REMOVED
        steady = not leaving and status in (VmStatus.READY, VmStatus.FAILED)  # store-only work, no client
        if not steady:
            if leaving and status != VmStatus.DELETING:
                _set_status(rec, VmStatus.DELETING, f"deleting {rec.instance_name}")
                status = VmStatus.DELETING
            elif status == VmStatus.PENDING:
                _set_status(rec, VmStatus.CREATING, f"creating {rec.instance_name}")
                status = VmStatus.CREATING
            ctx, spec = context_of(region.provider), _spec(s, region, rec)
    if steady:
        if status == VmStatus.READY:
            _health(sessions, region_id)
        return  # FAILED waits for the operator to remove the region
    if status == VmStatus.DELETING:
        _delete_vm(sessions, region_id, ctx, spec)
    elif status == VmStatus.CREATING:
        _create_vm(sessions, region_id, ctx, spec)
        _pin_ek(sessions, region_id, ctx)
    elif status == VmStatus.CREATED:
        _pin_ek(sessions, region_id, ctx)


def _save_progress(sessions: sessionmaker[Session], region_id: str) -> Callable[[str], None]:
    def save(line: str) -> None:
        with session_scope(sessions) as s:
            s.get(GcpStorageNode, region_id).progress = line

    return save


def _create_vm(sessions: sessionmaker[Session], region_id: str, ctx: GcpContext, spec: vm.StorageNodeSpec) -> None:
    try:
        made = vm.create(ctx, spec, on_progress=_save_progress(sessions, region_id))
    except vm.ProvisionFailed as exc:
        _fail(sessions, region_id, exc.message)
        return
    with session_scope(sessions) as s:
        rec = s.get(GcpStorageNode, region_id)
        if VmStatus(rec.status) != VmStatus.CREATING:
            return  # removal began meanwhile; the next pass deletes what we just made
        rec.zone, rec.running, rec.error = made.zone, made.status in ("RUNNING", "PROVISIONING", "STAGING"), None
        _set_status(rec, VmStatus.CREATED, f"{'adopted' if made.adopted else 'created'} {made.name} in {made.zone}")


def _fail(sessions: sessionmaker[Session], region_id: str, reason: str) -> None:
    with session_scope(sessions) as s:
        rec = s.get(GcpStorageNode, region_id)
        if VmStatus(rec.status) != VmStatus.CREATING:
            return
        rec.error = reason
        _set_status(rec, VmStatus.FAILED, reason)
        node, region = s.get(Node, rec.node_id), s.get(Region, region_id)
        if NodeState.ERRORED in _next(node):
            node_service.transition(s, node, NodeState.ERRORED, actor=ACTOR, reason=reason)
        if region.state not in (RegionState.ERRORED, RegionState.REMOVING, RegionState.REMOVED):
            region_service.transition(s, region, RegionState.ERRORED, actor=ACTOR, reason=reason)


def _next(node: Node) -> frozenset[NodeState]:
    from provisioner.states import NODE_TRANSITIONS

    return NODE_TRANSITIONS[NodeState(node.state)]


def ek_der(pem: str) -> bytes:
    """The EK as DER SubjectPublicKeyInfo (what `nodes.pinned_ek_public` holds and minion_id hashes)."""
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_public_key(pem.encode())
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _pin_ek(sessions: sessionmaker[Session], region_id: str, ctx: GcpContext) -> None:
    """Pin the vTPM's EK on the node and derive its minion_id from it (DESIGN.md: SHA-256 of the DER
    SubjectPublicKeyInfo, first 32 hex), so the VM's minion is recognised when it joins."""
    with session_scope(sessions) as s:
        rec = s.get(GcpStorageNode, region_id)
        if VmStatus(rec.status) != VmStatus.CREATED:
            return
        made = vm.StorageNode(name=rec.instance_name, zone=rec.zone or "", adopted=True, status="")
    der = ek_der(vm.ek_public(ctx, made))
    with session_scope(sessions) as s:
        rec = s.get(GcpStorageNode, region_id)
        if VmStatus(rec.status) != VmStatus.CREATED:
            return
        node = node_service.lock(s, s.get(Node, rec.node_id))
        node.pinned_ek_public = der
        node.minion_id = hashlib.sha256(der).hexdigest()[:32]
        _set_status(rec, VmStatus.READY, f"ready: {rec.instance_name} in {rec.zone} waits to join as minion {node.minion_id}")


def unhealthy_because(running: bool, node: Node) -> str | None:
    """Why a GCP region cannot serve now, or None: it needs its storage node's VM running (Compute's
    events), the node active (joined and attested) and reporting (heartbeats within the online window)."""
    if not running:
        return f"storage node {node.name}: its VM is not running"
    if node.state != NodeState.ACTIVE:
        return f"storage node {node.name} is {node.state}"
    if not is_online(node.last_heartbeat_at):
        return f"storage node {node.name} has not reported for {ONLINE_WINDOW.total_seconds():.0f} s"
    return None


def _health(sessions: sessionmaker[Session], region_id: str) -> None:
    """new/offline → healthy when nothing is wrong; healthy → offline with the reason otherwise. (A VM
    stop is reported at once by the event consumer; this pass also catches silent failures.)"""
    with session_scope(sessions) as s:
        rec = s.get(GcpStorageNode, region_id)
        region, node = s.get(Region, region_id), s.get(Node, rec.node_id)
        state = RegionState(region.state)
        why = unhealthy_because(rec.running, node)
        if why is None and state in (RegionState.NEW, RegionState.OFFLINE):
            region_service.transition(s, region, RegionState.HEALTHY, actor=ACTOR,
                                      reason=f"storage node {node.name} is active and reporting")
        elif why is not None and state == RegionState.HEALTHY:
            region_service.transition(s, region, RegionState.OFFLINE, actor=ACTOR, reason=why)


def _delete_vm(sessions: sessionmaker[Session], region_id: str, ctx: GcpContext, spec: vm.StorageNodeSpec) -> None:
    deleted = vm.delete(ctx, spec)
    with session_scope(sessions) as s:
        rec = s.get(GcpStorageNode, region_id)
        rec.running = False
        _set_status(rec, VmStatus.DELETED, f"{'deleted' if deleted else 'no VM to delete:'} {rec.instance_name} and its disks")
        node, region = s.get(Node, rec.node_id), s.get(Region, region_id)
        if node.state != NodeState.REMOVED:
            node_service.transition(s, node, NodeState.REMOVED, actor=ACTOR, reason=f"VM {rec.instance_name} deleted with its region")
        if region.state == RegionState.REMOVING:
            region_service.transition(s, region, RegionState.REMOVED, actor=ACTOR, reason=f"storage node VM {rec.instance_name} deleted")


# --- node events (Pub/Sub consumer) ---------------------------------------------------------------------


def apply_event(sessions: sessionmaker[Session], event: NodeEvent) -> None:
    """One instance event → store. Raising makes the consumer nack, so Pub/Sub redelivers it."""
    from provisioner.providers.gcp.events import NodeEventKind

    with session_scope(sessions) as s:
        rec = s.scalar(select(GcpStorageNode).where(GcpStorageNode.instance_name == event.instance,
                                                    GcpStorageNode.status != VmStatus.DELETED.value))
        if rec is None:
            return  # not (or no longer) one of our storage nodes
        region, node = s.get(Region, rec.region_id), s.get(Node, rec.node_id)
        state = RegionState(region.state)
        if state in (RegionState.REMOVING, RegionState.REMOVED) or VmStatus(rec.status) == VmStatus.DELETING:
            return  # our own removal
        why = f"storage node {node.name} {event.reason} ({event.method} at {event.timestamp or 'unknown time'})"
        if event.kind is NodeEventKind.OFFLINE:
            rec.running = False
            if state != RegionState.OFFLINE and RegionState.OFFLINE in _region_next(state):
                region_service.transition(s, region, RegionState.OFFLINE, actor="gcp:events", reason=why)
        elif event.kind is NodeEventKind.STARTED:
            rec.running = True  # healthy again once the node is active (health step)
        elif event.kind is NodeEventKind.DELETED:
            rec.running = False
            if NodeState.ERRORED in _next(node):
                node_service.transition(s, node, NodeState.ERRORED, actor="gcp:events",
                                        reason=f"{why}: deleted outside rigbase; remove the region and create it again")
            if state != RegionState.ERRORED:
                region_service.transition(s, region, RegionState.ERRORED, actor="gcp:events",
                                          reason=f"{why}: deleted outside rigbase; remove the region and create it again")


def _region_next(state: RegionState) -> frozenset[RegionState]:
    from provisioner.states import REGION_TRANSITIONS

    return REGION_TRANSITIONS[state]


class EventConsumerSupervisor:
    """Keeps one streaming-pull consumer running for the enabled gcp provider (a reconciler step):
    started when the provider is enabled, restarted if its stream died, stopped when it is removed."""

    def __init__(self) -> None:
        self._consumer: Any = None
        self._provider_id: str | None = None

    def step(self, sessions: sessionmaker[Session]) -> None:
        with session_scope(sessions) as s:
            prov = s.scalar(select(Provider).where(Provider.kind == KIND, Provider.state == ProviderState.ENABLED))
            wanted = (prov.id, context_of(prov), GcpProvider.names(config_of(prov))) if prov else None
        if wanted is None or wanted[0] != self._provider_id or (self._consumer and not self._consumer.running):
            self.stop()
        if wanted is not None and self._consumer is None:
            provider_id, ctx, names = wanted
            consumer = GcpProvider.event_consumer(ctx, names, lambda ev: apply_event(sessions, ev))
            consumer.start()
            self._consumer, self._provider_id = consumer, provider_id

    def stop(self) -> None:
        if self._consumer is not None:
            self._consumer.stop()
        self._consumer, self._provider_id = None, None


def _describe(exc: Exception) -> str:
    if isinstance(exc, RigbaseError):
        return exc.message
    return f"{type(exc).__name__}: {getattr(exc, 'message', None) or exc}"


def _one_line(text: str) -> str:
    return " ".join(text.split())[:500]
