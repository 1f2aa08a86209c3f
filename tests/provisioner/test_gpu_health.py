"""A node's GPU health on the control plane (services/fleet/gpu_health.py), on both stores: the minion's
report is kept through the heartbeat's reporters, a failed GPU takes the node out of placement with its
reason, a lost or busy GPU is not offered, a steady report writes nothing, and each change in or out of
placement is a line in the node's history; `node show` summarises it in one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sqlalchemy import func, select, update

import provisioner.api.app  # noqa: F401  (every contributor and reporter the server registers)
from bench.bench_fleet_heartbeats import seed
from contracts.gpu_health import GpuState
from minion.gpu.health import RecordedReader, assess
from provisioner.api.schemas import NodeOut
from provisioner.domain.hardware_text import gpu_health_line
from provisioner.domain.placement import PlacementRequest, Rejection, place
from provisioner.domain.states import NodeState
from provisioner.services import beat
from provisioner.services.jobs.job_placement import node_candidates
from provisioner.store.models import AuditEvent, Node
from tests.fixtures.postgres import Store

RECORDED = Path(__file__).resolve().parents[1] / "minion" / "nvml"


def _report(name: str, **states: GpuState) -> dict[str, Any]:
    """A recorded report, with some GPUs' states replaced (index → state, as `gpu_1=…`)."""
    report = assess(RecordedReader(RECORDED / name).read(), ours=lambda pid: pid == 4242)
    data = report.model_dump(mode="json")
    for key, state in states.items():
        gpu = data["gpus"][int(key.removeprefix("gpu_"))]
        gpu["state"], gpu["reason"] = state.value, None if state is GpuState.OK else gpu["reason"]
    return data


def _candidate(store: Store) -> Any:
    with store.sessions.begin() as s:  # type: ignore[attr-defined]
        (only,) = node_candidates(s)
        return only


def _history(store: Store, node_id: str) -> list[str]:
    with store.sessions.begin() as s:  # type: ignore[attr-defined]
        rows = s.scalars(
            select(AuditEvent.reason).where(AuditEvent.resource_id == node_id).order_by(AuditEvent.id)
        )
        return [r for r in rows if r and r.startswith("GPU health")]


def test_a_failed_gpu_takes_the_node_out_and_a_lost_one_is_not_offered(store: Store) -> None:
    (sim,) = seed(store.url, 1, 1_000_000)  # a node with 4 GPUs in its inventory
    with store.sessions.begin() as s:  # type: ignore[attr-defined]
        s.execute(update(Node).where(Node.id == sim.node_id).values(state=NodeState.ACTIVE.value))
    before = _candidate(store)
    assert (before.gpus_total, before.gpu_failed) == (4, None)  # no report yet: the inventory decides

    faults = _report("h100x4-faults.json")
    with store.sessions.begin() as s:  # type: ignore[attr-defined]
        beat.record_actual(s, s.get(Node, sim.node_id), {"gpu_health": faults})
    out = _candidate(store)
    assert out.gpu_failed == "GPU 0 failed: uncorrectable ECC errors (3) since the driver loaded (and 1 more)"
    request = PlacementRequest(account_id="a", gpu_types=frozenset(), gpu_count=1)
    placement = place(request, [out])
    [(_, reason, message)] = placement.rejected
    assert reason is Rejection.GPU_FAILED and placement.waits
    assert "uncorrectable ECC errors (3)" in message and "reset or replaced" in message

    # the same report again writes nothing: no new history line, the stored report unchanged
    with store.sessions.begin() as s:  # type: ignore[attr-defined]
        updated = s.get(Node, sim.node_id).updated_at
        beat.record_actual(s, s.get(Node, sim.node_id), {"gpu_health": faults})
    with store.sessions.begin() as s:  # type: ignore[attr-defined]
        assert s.get(Node, sim.node_id).updated_at == updated

    # reset: GPUs 0 and 1 healthy, 2 and 3 still lost: back in placement, two GPUs offered
    healed = _report("h100x4-faults.json", gpu_0=GpuState.OK, gpu_1=GpuState.OK)
    with store.sessions.begin() as s:  # type: ignore[attr-defined]
        beat.record_actual(s, s.get(Node, sim.node_id), {"gpu_health": healed})
    back = _candidate(store)
    assert (back.gpu_failed, back.gpus_total, back.gpus_free, back.gpus_unoffered) == (None, 2, 2, 2)
    too_many = place(PlacementRequest(account_id="a", gpu_types=frozenset(), gpu_count=4), [back])
    [(_, reason, message)] = too_many.rejected
    assert reason is Rejection.TOO_FEW_GPUS
    assert (
        "has 2 of 2 GPUs free (2 more not offered: lost or held outside rigbase), the job needs 4" in message
    )
    assert _history(store, sim.node_id) == [
        "GPU health: GPU 0 failed: uncorrectable ECC errors (3) since the driver loaded (and 1 more)",
        "GPU health: its GPUs are healthy again (2 offered)",
    ]

    with store.sessions.begin() as s:  # type: ignore[attr-defined]
        shown = NodeOut.of(s.get(Node, sim.node_id)).model_dump(mode="json")
    assert gpu_health_line(shown["gpu_health"]) == (
        "driver 550.127.05: 2 ok, 2 lost; GPU 2 lost: it has fallen off the bus (NVML: GPU is lost)"
    )


def test_an_unreadable_report_is_ignored_and_nvmls_problem_is_the_line(store: Store) -> None:
    (sim,) = seed(store.url, 1, 1_000_000)
    with store.sessions.begin() as s:  # type: ignore[attr-defined]
        beat.record_actual(s, s.get(Node, sim.node_id), {"gpu_health": {"gpus": "all of them"}})
        assert s.get(Node, sim.node_id).gpu_health is None
        beat.record_actual(s, s.get(Node, sim.node_id), {"gpu_health": _report("driver-not-loaded.json")})
    with store.sessions.begin() as s:  # type: ignore[attr-defined]
        node = s.get(Node, sim.node_id)
        line = gpu_health_line(node.gpu_health)
        assert line.startswith("the NVIDIA driver is installed but its kernel module is not loaded")
        assert (
            s.scalar(select(func.count()).select_from(AuditEvent).where(AuditEvent.resource_id == node.id))
            == 0
        )
    assert _candidate(store).gpus_total == 4  # NVML said nothing of the GPUs: the inventory decides
    assert json.dumps(node.gpu_health)  # stored as JSON on both stores


def test_a_node_without_its_cdi_spec_offers_no_gpu_and_says_why(store: Store) -> None:
    (sim,) = seed(store.url, 1, 1_000_000)
    with store.sessions.begin() as s:  # type: ignore[attr-defined]
        s.execute(update(Node).where(Node.id == sim.node_id).values(state=NodeState.ACTIVE.value))
    report = _report("h100x4-faults.json", gpu_0=GpuState.OK, gpu_1=GpuState.OK)
    report["cdi_problem"] = "cannot write the CDI spec in /var/run/cdi (Read-only file system): its GPUs …"
    with store.sessions.begin() as s:  # type: ignore[attr-defined]
        beat.record_actual(s, s.get(Node, sim.node_id), {"gpu_health": report})
    blocked = _candidate(store)
    assert (blocked.gpus_total, blocked.gpus_unoffered, blocked.gpu_failed) == (0, 4, None)
    [(_, reason, message)] = place(
        PlacementRequest(account_id="a", gpu_types=frozenset(), gpu_count=1), [blocked]
    ).rejected
    assert reason is Rejection.TOO_FEW_GPUS
    assert (
        "(4 more not offered: the node has no CDI spec: cannot write the CDI spec in /var/run/cdi" in message
    )
    with store.sessions.begin() as s:  # type: ignore[attr-defined]
        line = gpu_health_line(NodeOut.of(s.get(Node, sim.node_id)).model_dump(mode="json")["gpu_health"])
    assert line.endswith("; none offered: " + report["cdi_problem"])
