"""Reconciler: nodes in `provisioning` get their finalize playbook (provisioner/adapters/ansible.py).

Each pass picks every node in provisioning and runs its playbook; ok → maintenance, a failed task →
errored with that task's name and Ansible's message. Task events go into the node's history as they
happen. Nothing is remembered between passes, so a control plane restarted mid-playbook finds the node
still in provisioning and runs the (idempotent) playbook again; run_finalize stops a leftover
ansible-playbook of the killed process first.

Lab nodes (Node.lab_root set by the lab) are finalized through a chroot into that root; real nodes over
SSH with the control plane's key (provisioner/services/ssh_keys.py: the settings' `ssh_key_path`) to the
operator's hostname, else the address the minion last connected from, else the node's name.
The playbook runs through the runtime's Finalizer (provisioner/services/runtime.py): Ansible in the
control plane; the join benchmark and join-only tests inject one that skips it, since the playbook is
measured separately."""

from __future__ import annotations

import logging
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from contracts.errors import Conflict, RigbaseError
from provisioner.adapters.ansible import (
    ChrootTarget,
    FinalizeEvent,
    FinalizeRequest,
    SshTarget,
    Target,
    TaskStatus,
)
from provisioner.domain.states import NodeState
from provisioner.reconcilers.loop import register
from provisioner.services import audit, node_address
from provisioner.services import nodes as node_service
from provisioner.services.runtime import Runtime, runtime_of
from provisioner.services.wakeups import Wake
from provisioner.store.engine import session_scope
from provisioner.store.models import Node

log = logging.getLogger("rigbase.reconcilers.finalize")
ACTOR = "reconciler:finalize"
# Task events worth a history line (a "started" line per task would double the history for nothing).
RECORDED = {TaskStatus.OK, TaskStatus.CHANGED, TaskStatus.FAILED, TaskStatus.UNREACHABLE}


def target_for(node: Node, ssh_key: Path) -> Target:
    if node.lab_root:
        return ChrootTarget(Path(node.lab_root))
    return SshTarget(host=node.hostname or node_address.observed(node) or node.name, key_file=ssh_key)


# A storage node exports the region cache to the region's nodes. docs/product-rules.md: all
# nodes of a region reach each other over private (RFC 1918) addresses ("Physical regions"), so the
# RFC 1918 ranges are the export's default clients (they include GCP's default 10.128.0.0/9); an
# operator narrows them with the region setting `nfs_clients`.
DEFAULT_NFS_CLIENTS = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")


def request_for(node: Node, control_plane_url: str) -> FinalizeRequest:
    inventory = node.inventory or {}
    return FinalizeRequest(
        node_name=node.name,
        hostname=node.hostname or node.name,
        service=node.service,
        region=node.region.name,
        control_plane_url=control_plane_url,
        nvme_drives=inventory.get("drives") or [],
        nfs_clients=(node.region.settings or {}).get("nfs_clients") or DEFAULT_NFS_CLIENTS,
    )


def _finish(sessions: sessionmaker[Session], node_id: str, to: NodeState, reason: str) -> None:
    with session_scope(sessions) as session:
        node = session.get(Node, node_id)
        if node is not None and node.state == NodeState.PROVISIONING:
            node_service.transition(session, node, to, actor=ACTOR, reason=reason)


def finalize_node(sessions: sessionmaker[Session], node_id: str, runtime: Runtime | None = None) -> None:
    runtime = runtime or runtime_of(sessions)
    with session_scope(sessions) as session:
        node = session.get(Node, node_id)
        if node is None or node.state != NodeState.PROVISIONING:
            return
        name = node.name
        try:
            request, target = request_for(node, runtime.node_url()), target_for(node, runtime.ssh_key)
        except RigbaseError as exc:
            node_service.transition(
                session, node, NodeState.ERRORED, actor=ACTOR, reason=f"finalize: {exc.message}"
            )
            return

    def on_event(event: FinalizeEvent) -> None:
        if event.status not in RECORDED:
            return
        with session_scope(sessions) as s:
            audit.note(
                s,
                kind=node_service.KIND,
                resource_id=node_id,
                name=name,
                actor=ACTOR,
                state=NodeState.PROVISIONING.value,
                reason=f"task {event.task!r}: {event.status.value}"
                + (f": {event.message}" if event.message else ""),
            )

    try:
        result = runtime.finalizer.finalize(request, target, on_event)
    except Conflict:
        return  # another process is running this node's playbook; its result lands there
    except RigbaseError as exc:
        _finish(sessions, node_id, NodeState.ERRORED, f"finalize: {exc.message}")
        return
    if result.ok:
        _finish(
            sessions,
            node_id,
            NodeState.MAINTENANCE,
            f"finalized in {result.seconds:.1f} s ({result.changed} task(s) changed)",
        )
    else:
        _finish(
            sessions,
            node_id,
            NodeState.ERRORED,
            f"finalize failed at task {result.failed_task!r}: {result.message or result.status}",
        )


@register(Wake.FINALIZE, period_s=10.0)
def reconcile(sessions: sessionmaker[Session]) -> None:
    with session_scope(sessions) as session:
        ids = list(
            session.scalars(
                select(Node.id).where(Node.state == NodeState.PROVISIONING).order_by(Node.updated_at)
            )
        )
    runtime = runtime_of(sessions)
    for node_id in ids:
        try:
            finalize_node(sessions, node_id, runtime)
        except Exception:  # noqa: BLE001 - one node's failure must not starve the others
            log.exception("finalize of node %s failed; retrying next pass", node_id)
