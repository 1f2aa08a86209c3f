"""On-node finalize, the control plane's side (docs/join-protocol.md, "Finalize"; contracts/finalize.py).

The control plane never connects to a node. Every heartbeat answer of a node in provisioning,
maintenance or active carries its FinalizeWork under desired["finalize"]: the playbook of its service,
the playbook bundle's digest (provisioner/services/fleet/finalize_bundle.py) and the variables built here from
the node, its region and the region's storage node. The minion runs it and posts FinalizeReports
(`record`): task events become history lines, an ok outcome finishes provisioning (compute → maintenance,
storage → active) and records the applied generation, a failed one errors the node with the failing task.
A report for another generation than the node's current one changes nothing (a Conflict: 409).

`provision node retry` counts `Node.finalize_retry` up (`next_attempt`), which gives the node a new
generation, so its minion runs the playbook again even when nothing else changed."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from sqlalchemy import select
from sqlalchemy.orm import Session

from contracts.errors import Conflict, RigbaseError
from contracts.finalize import (
    FinalizeEvent,
    FinalizeReport,
    FinalizeWork,
    TaskStatus,
    generation_of,
)
from contracts.regional import StorageMode
from provisioner.domain.states import NodeState, Service
from provisioner.domain.task_lines import task_line
from provisioner.domain.text import printable
from provisioner.services.common import audit
from provisioner.services.common.runtime import runtime_of
from provisioner.services.fleet import finalize_bundle, node_address, node_credentials
from provisioner.services.fleet import nodes as node_service
from provisioner.store.models import AuditEvent, Node

log = logging.getLogger("rigbase.services.finalize")

PLAYBOOKS: Final[Mapping[Service, str]] = {
    Service.COMPUTE: "finalize-compute.yml",
    Service.STORAGE: "finalize-storage.yml",
    Service.DEVICE: "finalize-device.yml",
}
# The states whose heartbeat answers carry finalize work: a node converges from provisioning on, and
# re-applies whenever its generation changes (a retry, a replaced storage node's address).
WITH_WORK: Final = frozenset({NodeState.PROVISIONING, NodeState.MAINTENANCE, NodeState.ACTIVE})
# Where a successful first finalize takes a node (docs/product-rules.md: a storage node serves its region
# as soon as provisioning completes; a compute node waits for the operator).
FINISHED: Final[Mapping[Service, NodeState]] = {
    Service.COMPUTE: NodeState.MAINTENANCE,
    Service.STORAGE: NodeState.ACTIVE,
    Service.DEVICE: NodeState.ACTIVE,
}
# Task events worth a history line (a "started" line per task would double the history for nothing).
RECORDED: Final = frozenset({TaskStatus.OK, TaskStatus.CHANGED, TaskStatus.FAILED, TaskStatus.UNREACHABLE})
# A storage node exports the region cache to the region's nodes. docs/product-rules.md: all nodes of a
# region reach each other over private (RFC 1918) addresses ("Physical regions"), so the RFC 1918 ranges
# are the export's default clients (they include GCP's default 10.128.0.0/9); an operator narrows them
# with the region setting `nfs_clients`.
DEFAULT_NFS_CLIENTS: Final = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")
SATA_KINDS: Final = frozenset({"sata", "sas"})


# ---------------------------------------------------------------- the work


def _drive_path(entry: Mapping[str, Any]) -> str:
    path = str(entry.get("path") or "")
    if not path and entry.get("name"):
        path = "/dev/" + str(entry["name"]).removeprefix("/dev/")
    return path


def _inventory_drives(
    inventory: Sequence[Mapping[str, Any] | str], kinds: frozenset[str]
) -> list[dict[str, Any]]:
    """Drives of these kinds (a bare string is an NVMe path), one per path, sorted; a drive marked
    `system` (lab profiles mark it) or without a path or name is left out: nothing may be made of it."""
    drives: dict[str, dict[str, Any]] = {}
    for item in inventory:
        entry: Mapping[str, Any] = {"path": item} if isinstance(item, str) else item
        path = _drive_path(entry)
        if str(entry.get("kind", "nvme")) not in kinds or entry.get("system") or not path:
            continue
        drives[path] = {"path": path, "size_bytes": int(entry.get("size_bytes") or 0)}
        if "rotational" in entry:
            drives[path]["rotational"] = entry.get("rotational")
    return [drives[p] for p in sorted(drives)]


def scratch_drives(inventory: Sequence[Mapping[str, Any] | str]) -> list[dict[str, Any]]:
    """The NVMe drives that may hold scratch: every inventoried NVMe namespace except one marked `system`
    (on a real node the playbook also leaves out any drive it finds mounted)."""
    return [
        {k: v for k, v in d.items() if k != "rotational"}
        for d in _inventory_drives(inventory, frozenset({"nvme"}))
    ]


# what mounts the storage node's region cache in a central region
CACHE_CLIENTS = frozenset({Service.COMPUTE, Service.DEVICE})


def _storage_address(session: Session, node: Node) -> str | None:
    """The NFS server of a compute node or device in a central region (the region cache it mounts at
    /data/cache, where its jobs' and inference containers' models and data are): its storage node's
    operator hostname, else the address its minion last connected from; None in a local region or before
    there is one."""
    if node.service not in CACHE_CLIENTS or node.region.storage_mode != StorageMode.CENTRAL:
        return None
    storage = node_service.storage_node(session, node.region)
    if storage is None:
        return None
    return storage.hostname or node_address.observed(storage)


def variables_for(session: Session, node: Node, control_plane_url: str) -> dict[str, Any]:
    """The playbook's variables. `rigbase_lab` is not among them: the minion decides it (a lab node's
    minion runs the play in a chroot of its --host-root)."""
    inventory = node.inventory or {}
    drives = inventory.get("drives") or []
    local_compute = node.service == Service.COMPUTE and node.region.storage_mode == StorageMode.LOCAL
    return {
        "rigbase_node_name": node.name,
        "rigbase_hostname": node.hostname or node.name,
        "rigbase_service": str(node.service),
        "rigbase_region": node.region.name,
        "rigbase_control_plane_url": control_plane_url,
        "rigbase_storage_mode": str(node.region.storage_mode),
        "rigbase_nvme_drives": scratch_drives(drives),
        "rigbase_sata_drives": _inventory_drives(drives, SATA_KINDS) if local_compute else [],
        "rigbase_nfs_clients": list((node.region.settings or {}).get("nfs_clients") or DEFAULT_NFS_CLIENTS),
        "rigbase_nfs_server": _storage_address(session, node),
    }


def work_for(session: Session, node: Node) -> FinalizeWork | None:
    """The node's current finalize work, or None in a state that has none (new, enrolling, errored)."""
    if node.state not in WITH_WORK:
        return None
    runtime = runtime_of(session)
    bundle = finalize_bundle.bundle_for(runtime.settings.playbooks)
    playbook = PLAYBOOKS[Service(node.service)]
    variables = variables_for(session, node, runtime.node_url())
    return FinalizeWork(
        generation=generation_of(bundle.digest, playbook, variables, retry=node.finalize_retry),
        bundle_digest=bundle.digest,
        playbook=playbook,
        variables=variables,
    )


def desired_for_node(session: Session, node: Any) -> dict[str, Any] | None:
    try:
        work = work_for(session, node)
    except RigbaseError as exc:  # no playbooks to serve: the heartbeat itself must still be answered
        log.error("no finalize work for node %s: %s", node.name, exc.message)
        return None
    return None if work is None else work.model_dump(mode="json")


def record_actual(session: Session, node: Any, value: Any) -> None:
    """What the minion says of its finalize (state, generation applied, facts: scratch, export), shown by
    `provision node show`. Already bounded as part of the heartbeat's `actual` report."""
    if isinstance(value, dict) and value != node.finalize_actual:
        node.finalize_actual = value


def next_attempt(node: Node) -> None:
    """`provision node retry`: a new generation, so the minion runs the playbook again."""
    node.finalize_retry = (node.finalize_retry or 0) + 1


# ---------------------------------------------------------------- the reports


def _event_line(event: FinalizeEvent) -> str:
    return task_line(event.task, event.status, event.message)


def failure_reason(failed_task: str | None, message: str | None) -> str:
    said = message or "the playbook failed without a message"
    if failed_task:
        return printable(f"finalize failed at task {failed_task!r}: {said}")
    return printable(f"finalize failed: {said}")


def record(session: Session, node_id: str, credential: str | None, report: FinalizeReport) -> dict[str, Any]:
    """A minion's FinalizeReport: history lines, and once it ended, the node's new state."""
    node, _ = node_credentials.node_for_credential(session, node_id, credential)
    node_service.lock(session, node)
    work = work_for(session, node)
    if work is None or report.generation != work.generation:
        current = work.generation if work is not None else f"none while {node.state}"
        raise Conflict(
            f"finalize report for generation {report.generation} is not node '{node.name}''s current one "
            f"({current}): nothing was recorded; take the work from the next heartbeat answer",
            code="finalize_generation_stale",
        )
    actor = f"minion:{node.minion_id}"
    node.finalize_reported_at = datetime.now(UTC)
    for event in report.events:
        if event.status in RECORDED:
            audit.note(
                session,
                kind=node_service.KIND,
                resource_id=node.id,
                name=node.name,
                actor=actor,
                state=node.state,
                reason=_event_line(event),
            )
    outcome = report.outcome
    if outcome is not None and outcome.ok:
        node.finalize_applied = report.generation
        done = f"finalized in {outcome.seconds:.1f} s ({outcome.changed} task(s) changed)"
        if node.state == NodeState.PROVISIONING:
            node_service.transition(session, node, FINISHED[Service(node.service)], actor=actor, reason=done)
        else:
            audit.note(
                session,
                kind=node_service.KIND,
                resource_id=node.id,
                name=node.name,
                actor=actor,
                state=node.state,
                reason=f"finalize re-applied: {done}",
            )
    elif outcome is not None:
        reason = failure_reason(outcome.failed_task, outcome.message)
        node_service.transition(session, node, NodeState.ERRORED, actor=actor, reason=reason)
    session.flush()
    return {"node_id": node.id, "state": node.state, "generation": report.generation}


# ---------------------------------------------------------------- nodes that never report


def waiting_since(session: Session, node: Node) -> datetime:
    """Since when a node in provisioning waits for its minion's finalize: its last report, else when it
    entered provisioning (its history), else its last update."""
    entered = session.scalar(
        select(AuditEvent.at)
        .where(
            AuditEvent.resource_kind == node_service.KIND,
            AuditEvent.resource_id == node.id,
            AuditEvent.to_state == NodeState.PROVISIONING,
            AuditEvent.from_state != NodeState.PROVISIONING,
        )
        .order_by(AuditEvent.id.desc())
        .limit(1)
    )
    return max(t for t in (node.finalize_reported_at, entered or node.updated_at) if t is not None)


def time_out(session: Session, node: Node, *, timeout_s: float, now: datetime, actor: str) -> bool:
    """Error `node` when it stayed in provisioning without a finalize report for `timeout_s`."""
    if node.state != NodeState.PROVISIONING:
        return False
    since = waiting_since(session, node)
    if (now - since).total_seconds() < timeout_s:
        return False
    span = f"{timeout_s / 60:g} min" if timeout_s >= 120 else f"{timeout_s:g} s"
    after = "its last one" if since == node.finalize_reported_at else "entering provisioning"
    node_service.transition(
        session,
        node,
        NodeState.ERRORED,
        actor=actor,
        reason=(
            f"no finalize report from the minion within {span} of {after} "
            f"({since.isoformat(timespec='seconds')}): check that the node runs a minion that finalizes "
            f"(journalctl -u rigbase-minion), then provision node retry {node.name}"
        ),
    )
    return True
