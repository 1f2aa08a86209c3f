"""The Google Cloud reconcilers: the slow work behind `provider enable gcp` and `region create`, done
through the provider's lifecycle (provisioner/providers/base.py; Google is called only there).

- gcp-provider: bootstraps `new` providers (→ enabled / errored) and tears down `removing` ones.
- gcp-regions: creates each region's storage node VM, pins its EK, keeps region health, deletes the
  VM when the region is removed.
- gcp-events: keeps the provider's event subscription running while it is enabled; each event goes
  to services/jobs/gcp_events.py.

Every step reads the store, calls the provider outside any transaction, and records the outcome in a
short unit of work, so a control plane killed anywhere resumes from the store. A stopped VM makes its
region `offline` (services/jobs/gcp_events.py); when the VM runs again and the node is active, the health
step here moves the region back to healthy."""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from contracts.errors import RigbaseError
from contracts.identity import minion_id_from_spki
from provisioner.domain.states import (
    NODE_TRANSITIONS,
    REGION_LEAVING,
    REGION_SETTLED_BAD,
    VM_TRANSITIONS,
    NodeState,
    ProviderState,
    RegionState,
    VmStatus,
)
from provisioner.providers.base import (
    EventWatch,
    Progress,
    ProviderConfig,
    ProvisionFailed,
    RegionNode,
    RegionNodeSpec,
)
from provisioner.providers.gcp import images as gcp_images
from provisioner.reconcilers import region_health
from provisioner.reconcilers.loop import register
from provisioner.services.cloud import gcp, image_publish
from provisioner.services.common import lifecycle
from provisioner.services.common.runtime import runtime_of
from provisioner.services.common.wakeups import Wake
from provisioner.services.fleet import nodes as node_service
from provisioner.services.jobs import gcp_events
from provisioner.services.regions import providers as provider_service
from provisioner.services.regions import regions as region_service
from provisioner.store.engine import session_scope
from provisioner.store.gcp_models import GcpBootstrap, GcpStorageNode
from provisioner.store.models import Node, Provider, Region

log = logging.getLogger("rigbase.gcp")
KIND = gcp.KIND
ACTOR = "reconciler:gcp"
VM_KIND = gcp.VM_KIND
REASON_MAX = 500  # characters of a provider error kept as the reason


# --- gcp-provider: bootstrap / teardown ------------------------------------------------------------


@register(Wake.GCP_PROVIDER, period_s=5.0)
def bootstrap_step(sessions: sessionmaker[Session]) -> None:
    """Bootstrap `new` gcp providers (→ enabled / errored), tear down `removing` ones."""
    impl = runtime_of(sessions).provider(KIND)
    with session_scope(sessions) as s:
        todo = [
            (p.id, p.state, provider_service.config_of(s, p))
            for p in s.scalars(
                select(Provider).where(
                    Provider.kind == KIND, Provider.state.in_([ProviderState.NEW, ProviderState.REMOVING])
                )
            )
        ]
    for provider_id, state, config in todo:
        say = _progress_saver(sessions, provider_id)
        try:
            if state == ProviderState.NEW:
                made = impl.bootstrap(config, say)
                _finish_provider(
                    sessions,
                    provider_id,
                    ProviderState.NEW,
                    ProviderState.ENABLED,
                    f"bootstrap complete ({len(made)} created)",
                    made=[f"{a.kind} {a.name}" for a in made],
                )
            else:
                gone = impl.teardown(config, say)
                _finish_provider(
                    sessions,
                    provider_id,
                    ProviderState.REMOVING,
                    ProviderState.REMOVED,
                    f"teardown complete ({len(gone)} deleted)",
                )
        except Exception as exc:
            reason = _one_line(
                f"{'bootstrap' if state == ProviderState.NEW else 'teardown'} failed: {_describe(exc)}"
            )
            log.warning("gcp provider %s: %s", provider_id, reason)
            _finish_provider(sessions, provider_id, ProviderState(state), ProviderState.ERRORED, reason)


def _progress_saver(sessions: sessionmaker[Session], provider_id: str) -> Progress:
    def save(line: str) -> None:
        with session_scope(sessions) as s:
            row = s.get(GcpBootstrap, provider_id) or GcpBootstrap(provider_id=provider_id, created=[])
            row.progress = line
            s.add(row)

    return save


def _finish_provider(
    sessions: sessionmaker[Session],
    provider_id: str,
    expected: ProviderState,
    to: ProviderState,
    note: str,
    made: list[str] | None = None,
) -> None:
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


# --- gcp-regions: each region's storage node -----------------------------------------------------------


def _set_status(rec: GcpStorageNode, to: VmStatus, progress: str | None = None) -> None:
    """Move the VM along VM_TRANSITIONS through the audited path (staying put only updates progress)."""
    if to != VmStatus(rec.status):
        session = Session.object_session(rec)
        assert session is not None, "a storage VM record changes inside its session"
        lifecycle.apply(
            session,
            rec,
            to,
            kind=VM_KIND,
            name=rec.instance_name,
            table=VM_TRANSITIONS,
            actor=ACTOR,
            reason=progress,
            column="status",
            resource_id=rec.region_id,
        )
    if progress is not None:
        rec.progress = progress


def _spec(session: Session, region: Region, rec: GcpStorageNode) -> RegionNodeSpec:
    token = runtime_of(session).sealer.unseal(rec.sealed_join_token).decode()
    return RegionNodeSpec(
        region_id=region.id,
        region=region.name,
        settings=dict(region.settings or {}),
        bundle=gcp.enrollment_bundle(session, region, token),
        image=image_publish.source_image(session, region),
    )


@register(Wake.GCP_REGIONS, period_s=3.0)
def storage_nodes_step(sessions: sessionmaker[Session]) -> None:
    """Drive every GCP storage node towards what its region wants (after the images being imported: a
    region waiting for its first image gets its VM in the pass that sees it published)."""
    _images_step(sessions)
    with session_scope(sessions) as s:
        ids = list(
            s.scalars(select(GcpStorageNode.region_id).where(GcpStorageNode.status != VmStatus.DELETED.value))
        )
    for region_id in ids:
        try:
            _reconcile_one(sessions, region_id)
        except Exception:
            log.exception("gcp storage node of region %s: pass failed, retrying next pass", region_id)


def _reconcile_one(sessions: sessionmaker[Session], region_id: str) -> None:
    with session_scope(sessions) as s:
        rec = s.get_one(GcpStorageNode, region_id)
        region = s.get_one(Region, region_id)
        node = s.get_one(Node, rec.node_id)
        status = VmStatus(rec.status)
        leaving = region.state in REGION_LEAVING or node.state == NodeState.REMOVED
        steady = not leaving and status in (VmStatus.READY, VmStatus.FAILED)  # store-only work, no client
        if not steady:
            if leaving and status != VmStatus.DELETING:
                _set_status(rec, VmStatus.DELETING, f"deleting {rec.instance_name}")
                status = VmStatus.DELETING
            elif status == VmStatus.PENDING:
                if image_publish.source_image(s, region) is None:
                    rec.progress = gcp_images.waiting_reason(region.name)
                    return  # `provision image publish` wakes this reconciler
                _set_status(rec, VmStatus.CREATING, f"creating {rec.instance_name}")
                status = VmStatus.CREATING
            config, spec = provider_service.config_of(s, region.provider), _spec(s, region, rec)
    if steady:
        if status == VmStatus.READY:
            _health(sessions, region_id)
        return  # FAILED waits for the operator to remove the region
    if status == VmStatus.DELETING:
        _delete_vm(sessions, region_id, config, spec)
    elif status == VmStatus.CREATING:
        _create_vm(sessions, region_id, config, spec)
        _pin_ek(sessions, region_id, config)
    elif status == VmStatus.CREATED:
        _pin_ek(sessions, region_id, config)


def _images_step(sessions: sessionmaker[Session]) -> None:
    """Images being imported (`provision image publish`): READY → published, FAILED → failed."""
    with session_scope(sessions) as s:
        ids = image_publish.importing(s)
    for pub_id in ids:
        try:
            with session_scope(sessions) as s:
                image_publish.refresh(s, pub_id, actor=ACTOR)
        except Exception:
            log.exception("image publication %s: pass failed, retrying next pass", pub_id)


def _save_progress(sessions: sessionmaker[Session], region_id: str) -> Progress:
    def save(line: str) -> None:
        with session_scope(sessions) as s:
            s.get_one(GcpStorageNode, region_id).progress = line

    return save


def _create_vm(
    sessions: sessionmaker[Session], region_id: str, config: ProviderConfig, spec: RegionNodeSpec
) -> None:
    try:
        made = (
            runtime_of(sessions)
            .provider(KIND)
            .create_region_node(config, spec, _save_progress(sessions, region_id))
        )
    except ProvisionFailed as exc:
        _fail(sessions, region_id, exc.message)
        return
    with session_scope(sessions) as s:
        rec = s.get_one(GcpStorageNode, region_id)
        if VmStatus(rec.status) != VmStatus.CREATING:
            return  # removal began meanwhile; the next pass deletes what we just made
        rec.zone, rec.running, rec.error = made.zone, made.running, None
        _set_status(
            rec, VmStatus.CREATED, f"{'adopted' if made.adopted else 'created'} {made.name} in {made.zone}"
        )


def _fail(sessions: sessionmaker[Session], region_id: str, reason: str) -> None:
    with session_scope(sessions) as s:
        rec = s.get_one(GcpStorageNode, region_id)
        if VmStatus(rec.status) != VmStatus.CREATING:
            return
        rec.error = reason
        _set_status(rec, VmStatus.FAILED, reason)
        node, region = s.get_one(Node, rec.node_id), s.get_one(Region, region_id)
        if NodeState.ERRORED in NODE_TRANSITIONS[NodeState(node.state)]:
            node_service.transition(s, node, NodeState.ERRORED, actor=ACTOR, reason=reason)
        if region.state not in REGION_SETTLED_BAD:
            region_service.transition(s, region, RegionState.ERRORED, actor=ACTOR, reason=reason)


def _pin_ek(sessions: sessionmaker[Session], region_id: str, config: ProviderConfig) -> None:
    """Pin the vTPM's EK on the node and derive its minion_id from it (docs/join-protocol.md: SHA-256 of
    the DER SubjectPublicKeyInfo, first 32 hex), so the VM's minion is recognised when it joins."""
    with session_scope(sessions) as s:
        rec = s.get_one(GcpStorageNode, region_id)
        if VmStatus(rec.status) != VmStatus.CREATED:
            return
        made = RegionNode(name=rec.instance_name, zone=rec.zone or "", adopted=True, running=rec.running)
    der = runtime_of(sessions).provider(KIND).region_node_ek(config, made)
    with session_scope(sessions) as s:
        rec = s.get_one(GcpStorageNode, region_id)
        if VmStatus(rec.status) != VmStatus.CREATED:
            return
        node = node_service.lock(s, s.get_one(Node, rec.node_id))
        node.pinned_ek_public = der
        node.minion_id = minion_id_from_spki(der)
        _set_status(
            rec,
            VmStatus.READY,
            f"ready: {rec.instance_name} in {rec.zone} waits to join as minion {node.minion_id}",
        )


def _health(sessions: sessionmaker[Session], region_id: str) -> None:
    """The region's health by the GCP driver's rule (reconcilers/region_health.py), right after the VM is
    ready; the region-health pass repeats it, and the event consumer reports a stopped VM at once."""
    with session_scope(sessions) as s:
        region_health.refresh_region(s, s.get_one(Region, region_id))


def _delete_vm(
    sessions: sessionmaker[Session], region_id: str, config: ProviderConfig, spec: RegionNodeSpec
) -> None:
    deleted = runtime_of(sessions).provider(KIND).delete_region_node(config, spec)
    with session_scope(sessions) as s:
        rec = s.get_one(GcpStorageNode, region_id)
        rec.running = False
        _set_status(
            rec,
            VmStatus.DELETED,
            f"{'deleted' if deleted else 'no VM to delete:'} {rec.instance_name} and its disks",
        )
        node, region = s.get_one(Node, rec.node_id), s.get_one(Region, region_id)
        if node.state != NodeState.REMOVED:
            node_service.transition(
                s,
                node,
                NodeState.REMOVED,
                actor=ACTOR,
                reason=f"VM {rec.instance_name} deleted with its region",
            )
        if region.state == RegionState.REMOVING:
            region_service.transition(
                s,
                region,
                RegionState.REMOVED,
                actor=ACTOR,
                reason=f"storage node VM {rec.instance_name} deleted",
            )


# --- gcp-events: the event subscription's supervisor --------------------------------------------------


class EventWatchSupervisor:
    """Keeps one event subscription running for the enabled gcp provider: started when the provider is
    enabled, restarted if its stream died, stopped when it is removed."""

    def __init__(self) -> None:
        self._watch: EventWatch | None = None
        self._provider_id: str | None = None

    def step(self, sessions: sessionmaker[Session]) -> None:
        with session_scope(sessions) as s:
            prov = s.scalar(
                select(Provider).where(Provider.kind == KIND, Provider.state == ProviderState.ENABLED)
            )
            wanted = (prov.id, provider_service.config_of(s, prov)) if prov else None
        if wanted is None or wanted[0] != self._provider_id or (self._watch and not self._watch.running):
            self.stop()
        if wanted is not None and self._watch is None:
            provider_id, config = wanted
            watch = (
                runtime_of(sessions)
                .provider(KIND)
                .watch_events(config, lambda ev: gcp_events.apply_event(sessions, ev))
            )
            if watch is None:
                return
            watch.start()
            self._watch, self._provider_id = watch, provider_id

    def stop(self) -> None:
        if self._watch is not None:
            self._watch.stop()
        self._watch, self._provider_id = None, None


_events = EventWatchSupervisor()


@register(Wake.GCP_EVENTS, period_s=5.0)
def events_step(sessions: sessionmaker[Session]) -> None:
    _events.step(sessions)


def _describe(exc: Exception) -> str:
    if isinstance(exc, RigbaseError):
        return exc.message
    detail: Any = getattr(exc, "message", None) or exc
    return f"{type(exc).__name__}: {detail}"


def _one_line(text: str) -> str:
    return " ".join(text.split())[:REASON_MAX]
