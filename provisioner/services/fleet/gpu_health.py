"""A node's GPU health (contracts/gpu_health.py): asked of every compute node, kept on the node as its
minion reports it, and read by placement and `node show`.

The report is written only when it changed, so a steady beat writes nothing for it; a GPU that fails or
comes back is one line in the node's history, with its reason."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session

from contracts.gpu_health import GpuHealthReport
from provisioner.domain.states import Service
from provisioner.services.common import audit, node_reports
from provisioner.services.common.errors import flush
from provisioner.store.models import Node


def desired_for_node(session: Session, node: Node) -> bool:
    """Whether the node reports its GPUs' health: compute nodes, which run jobs on them."""
    return bool(node.service == Service.COMPUTE)


def report_of(node: Node) -> GpuHealthReport | None:
    """The node's last report, or None (never reported, or stored by an older schema)."""
    if not node.gpu_health:
        return None
    try:
        return GpuHealthReport.model_validate(node.gpu_health)
    except ValidationError:
        return None


def record_actual(session: Session, node: Node, value: Any) -> None:
    report = node_reports.read(node, GpuHealthReport, value, "GPU health")
    before = report_of(node)
    if report is None or not node_reports.store_changed(node, "gpu_health", report):
        return
    was, now = before.out_of_placement() if before else None, report.out_of_placement()
    if was != now:
        why = now or f"its GPUs are healthy again ({report.offered()} offered)"
        audit.record(
            session, kind="node", resource_id=node.id, name=node.name, actor=f"node:{node.name}",
            from_state=node.state, to_state=node.state, reason=f"GPU health: {why}",
        )  # fmt: skip
    flush(session, f"node {node.name}")
