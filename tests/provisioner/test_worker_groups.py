"""Gang and independent jobs, worker groups, peers and billing per worker (issue 41), through the real
jobs service and heartbeat reports on SQLite and PostgreSQL: the fleet is three 2-GPU nodes of one region,
each beating from its own LAN address.

- A gang of 3 x 2 GPUs spreads over the 3 nodes, each worker told its rank, the world and every peer's
  address and port (rigbase's, torchrun's and OpenPAI's variables), and fails whole when one exits 1.
- A gang the fleet could never hold is refused at create with what would make it fit; a worker larger
  than the largest node too.
- An independent sweep of 4 places 3 now (6 GPUs, 2 each), the fourth when one ends; one failing worker
  leaves the others running; each is billed from its own start to its own end.
- Groups with their own resources (a CPU parameter server and GPU workers) hold what each asks."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from contracts.errors import RuleViolation
from contracts.jobspec import JobSpec
from provisioner.domain.roles import Principal
from provisioner.domain.states import NodeState
from provisioner.services.billing import metering
from provisioner.services.fleet import node_address, nodes
from provisioner.services.jobs import job_assignments, job_peers, job_placement, jobs
from provisioner.services.regions import providers
from provisioner.services.regions import regions as region_service
from provisioner.store.billing_models import LedgerEntry
from provisioner.store.job_models import Job
from provisioner.store.models import Node
from tests.fixtures.postgres import Store
from tests.provisioner.test_billing_ledger import A100, ACTOR, principal_named

NODES = ("n0", "n1", "n2")
ADDRESS = {"n0": "10.9.0.10", "n1": "10.9.0.11", "n2": "10.9.0.12"}


def _fleet(sessions: sessionmaker[Session]) -> Principal:
    with sessions.begin() as s:
        root = principal_named(s, "default")
        providers.enable(s, "physical", {}, actor=ACTOR)
        region_service.create(s, "r1", provider="physical", actor=ACTOR, account_id=root.account_id)
        for i, name in enumerate(NODES):
            node = nodes.add(s, name, region="r1", minion_id=f"{i + 40:032x}", actor=ACTOR)
            for state in (NodeState.ENROLLING, NodeState.PROVISIONING, NodeState.ACTIVE):
                nodes.transition(s, node, state, actor=ACTOR)
            inventory = {
                "hostname": name,
                "cpu": {"physical_cores": 8, "threads": 16},
                "memory_total_bytes": 64 * 2**30,
                "tpm": {"present": True},
                "gpus": [A100, {**A100, "pci_address": "0000:02:00.0"}],
            }
            nodes.record_report(s, node, inventory=inventory, requirements={"ok": True, "rules": []})
            node_address.record(node, ADDRESS[name])
        return root


def _spec(data: dict[str, Any]) -> JobSpec:
    return JobSpec.model_validate({"type": "training", **data})


def _a100(count: int = 1) -> dict[str, Any]:
    return {"gpu_types": ["A100 40GB"], "gpu_count": count}


def _desired(s: Session, node: str) -> list[dict[str, Any]]:
    return list(job_assignments.desired_for_node(s, nodes.get(s, node))["workers"])


def _report(s: Session, node: str, job_id: str, worker: int, state: str, **more: Any) -> None:
    mine = [w for w in _desired(s, node) if w["job_id"] == job_id and w["worker"] == worker]
    assert mine, f"worker {worker} is not on {node}"
    report = {"job_id": job_id, "worker": worker, "generation": mine[0]["generation"], "state": state}
    job_assignments.record_actual(s, nodes.get(s, node), {"workers": [{**report, **more}]})


def _node_of(s: Session, job_id: str, worker: int) -> str:
    job = s.get_one(Job, job_id)
    found = s.get(Node, job.workers[worker].node_id)
    assert found is not None
    return found.name


def test_a_gang_spreads_over_nodes_tells_each_worker_its_peers_and_fails_whole(store: Store) -> None:
    sessions: sessionmaker[Session] = store.sessions  # type: ignore[assignment]
    root = _fleet(sessions)
    spec = _spec({"name": "ddp", "kind": "gang", "resources": _a100(2), "workers": ["python ddp.py"] * 3})
    with sessions.begin() as s:
        sub = jobs.create(s, root, spec)
        assert sub.job is not None and sub.job.state == "starting", sub.decision.reason
        job_id = sub.job.id
        placed = {_node_of(s, job_id, i) for i in range(3)}
        assert placed == set(NODES)  # 2 GPUs a node: one worker on each
    with sessions.begin() as s:
        env = {}
        for i in range(3):
            (assignment,) = [w for w in _desired(s, _node_of(s, job_id, i)) if w["job_id"] == job_id]
            env[i] = assignment["env"]
            assert assignment["port"] == 29500 and len(assignment["peers"]) == 2
        rank0 = ADDRESS[_node_of(s, job_id, 0)]
        for i in range(3):
            assert env[i]["RANK"] == env[i]["RIGBASE_RANK"] == str(i)
            assert env[i]["WORLD_SIZE"] == "3" and env[i]["MASTER_ADDR"] == rank0
            assert env[i]["MASTER_PORT"] == "29500"
            peers = env[i]["RIGBASE_PEERS"].split(",")
            assert peers == [f"{ADDRESS[_node_of(s, job_id, k)]}:29500" for k in range(3)]
            assert env[i]["PAI_TASK_ROLE_LIST"] == "worker"
            assert env[i]["PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX"] == str(i)
            assert env[i]["PAI_HOST_IP_worker_2"] == ADDRESS[_node_of(s, job_id, 2)]
            assert env[i]["PAI_worker_1_port_PORT"] == "29500"
    with sessions.begin() as s:
        for i in range(3):
            _report(s, _node_of(s, job_id, i), job_id, i, "running")
        assert s.get_one(Job, job_id).state == "running"
        _report(s, _node_of(s, job_id, 1), job_id, 1, "exited", exit_code=1)
        job = s.get_one(Job, job_id)
        assert job.state == "failed" and job.reason == "worker 1: exited with code 1"
        assert job.workers[0].stop_requested and job.workers[2].stop_requested


def test_a_job_the_fleet_can_never_hold_is_refused_with_what_would_make_it_fit(store: Store) -> None:
    sessions: sessionmaker[Session] = store.sessions  # type: ignore[assignment]
    root = _fleet(sessions)
    gang = _spec({"name": "big", "kind": "gang", "resources": _a100(2), "workers": ["x"] * 4})
    wide = _spec({"name": "wide", "resources": _a100(4), "workers": ["x"]})
    with sessions.begin() as s:
        with pytest.raises(RuleViolation) as too_many:
            jobs.create(s, root, gang)
        with pytest.raises(RuleViolation) as too_wide:
            jobs.create(s, root, wide)
        dry = jobs.create(s, root, gang, dry_run=True)
        assert dry.decision.unplaceable and dry.decision.reason == str(too_many.value)
        assert s.scalar(select(Job)) is None  # nothing stored
    assert too_many.value.code == "unplaceable"
    assert str(too_many.value) == (
        "Unplaceable: the gang's 4 workers need 8 GPUs in one region; the largest region for them, r1, has "
        "6 in all: use fewer or smaller workers, make it an independent job, or add nodes to one region"
    )
    assert str(too_wide.value) == (
        "Unplaceable: no node of A100 40GB can hold one worker of 4 GPUs; the largest, n2 (r1), has 2: "
        "ask for at most 2 GPUs per worker (resources.gpu_count), or add a larger node"
    )
    # the same four workers as a sweep: each fits a node, so it is taken and runs as capacity allows
    sweep = _spec({"name": "big", "kind": "independent", "resources": _a100(2), "workers": ["x"] * 4})
    with sessions.begin() as s:
        assert jobs.create(s, root, sweep).job is not None


def test_a_sweeps_workers_run_fail_and_are_billed_each_on_their_own(store: Store) -> None:
    sessions: sessionmaker[Session] = store.sessions  # type: ignore[assignment]
    root = _fleet(sessions)
    spec = _spec(
        {
            "name": "sweep",
            "kind": "independent",
            "resources": _a100(2),
            "workers": [f"python train.py --lr {lr}" for lr in (0.1, 0.01, 0.001, 0.0001)],
        }
    )
    with sessions.begin() as s:
        sub = jobs.create(s, root, spec)
        assert sub.job is not None and sub.job.state == "starting"
        job_id = sub.job.id
        states = [w.state for w in sub.job.workers]
        assert states == ["starting", "starting", "starting", "waiting"]
        assert sub.job.reason is not None and "3 of 4 workers placed, the others wait" in sub.job.reason
    with sessions.begin() as s:
        for i in range(3):
            _report(s, _node_of(s, job_id, i), job_id, i, "running")
        job = s.get_one(Job, job_id)
        assert job.state == "running"
        assert "RIGBASE_PEERS" not in _desired(s, _node_of(s, job_id, 0))[0]["env"]  # no peers in a sweep
        _report(s, _node_of(s, job_id, 1), job_id, 1, "exited", exit_code=1)  # fails only itself
        job = s.get_one(Job, job_id)
        assert job.state == "running"
        assert [w.state for w in job.workers][:3] == ["running", "failed", "running"]
        assert not job.workers[0].stop_requested
    with sessions.begin() as s:  # the reconciler's pass: worker 3 takes the freed GPUs
        jobs.place_waiting(s, s.get_one(Job, job_id), actor=ACTOR)
        job = s.get_one(Job, job_id)
        assert job.workers[3].state == "starting" and job.workers[3].node_id == job.workers[1].node_id
        _report(s, _node_of(s, job_id, 3), job_id, 3, "running")
        for i in (0, 2, 3):
            _report(s, _node_of(s, job_id, i), job_id, i, "exited", exit_code=0)
        job = s.get_one(Job, job_id)
        assert job.state == "failed"
        assert job.reason == "1 of 4 workers failed: worker 1: exited with code 1"
    # each worker ran for its own time: 1 h, 10 min, 2 h and 30 min
    ran = {0: timedelta(hours=1), 1: timedelta(minutes=10), 2: timedelta(hours=2), 3: timedelta(minutes=30)}
    with sessions.begin() as s:
        job = s.get_one(Job, job_id)
        start = job.created_at
        for worker in job.workers:
            worker.started_at = start
            worker.ended_at = start + ran[worker.index]
        end = max(w.ended_at for w in job.workers if w.ended_at is not None)
        metering.meter(s, end + timedelta(minutes=1))
    with sessions() as s:
        usage = {
            worker: sum(
                (
                    Decimal(e.amount_micros) / 10**6
                    for e in s.scalars(select(LedgerEntry).where(LedgerEntry.job_id == job_id))
                    if e.worker == worker
                ),
                Decimal(0),
            )
            for worker in range(4)
        }
        fee = Decimal("0.25") * 2  # the owner's own A100s: the datacenter usage fee, 2 GPUs a worker
        hours = {w: Decimal(int(t.total_seconds())) / 3600 for w, t in ran.items()}
        assert usage == {w: (fee * h).quantize(Decimal("0.000001")) for w, h in hours.items()}


def test_groups_hold_their_own_resources_and_openpais_roles_are_told_apart(store: Store) -> None:
    sessions: sessionmaker[Session] = store.sessions  # type: ignore[assignment]
    root = _fleet(sessions)
    spec = _spec(
        {
            "name": "ps-workers",
            "groups": [
                {"name": "ps", "command": "python ps.py", "resources": {"gpu_count": 0, "cpu_count": 4}},
                {"name": "worker", "count": 2, "command": "python worker.py", "resources": _a100(1)},
            ],
        }
    )
    with sessions.begin() as s:
        sub = jobs.create(s, root, spec)
        assert sub.job is not None and sub.job.state == "starting", sub.decision.reason
        job = sub.job
        assert [(w.group_name, w.group_index, w.gpu_count, w.cpu_count) for w in job.workers] == [
            ("ps", 0, 0, 4),
            ("worker", 0, 1, 0),
            ("worker", 1, 1, 0),
        ]
        busy = job_placement.busy_by_node(s)
        assert sum(b.gpus for b in busy.values()) == 2 and sum(b.vcpus for b in busy.values()) == 4
        job_id = job.id
    with sessions.begin() as s:
        node = _node_of(s, job_id, 0)
        (ps,) = [w for w in _desired(s, node) if w["job_id"] == job_id and w["worker"] == 0]
        assert ps["gpu_count"] == 0 and ps["command"] == "python ps.py"
        env = ps["env"]
        assert env["PAI_TASK_ROLE_LIST"] == "ps,worker" and env["PAI_TASK_ROLE_COUNT"] == "2"
        assert env["PAI_TASK_ROLE_TASK_COUNT_worker"] == "2" and env["PAI_CURRENT_TASK_ROLE_NAME"] == "ps"
        assert env["PAI_RESOURCE_ps"].startswith("0,4,") and env["PAI_RESOURCE_worker"].startswith("1,0,")
        assert env["RIGBASE_GROUP"] == "ps" and env["RIGBASE_WORLD_SIZE"] == "3"


def test_a_worker_that_ran_between_two_beats_is_billed_for_the_time_it_ran(store: Store) -> None:
    """A 3-second job: its node's next beat says it exited 0 after 3 s (its container's own times); the
    control plane never saw it running, and bills those 3 s, not nothing and not a whole beat."""
    sessions: sessionmaker[Session] = store.sessions  # type: ignore[assignment]
    root = _fleet(sessions)
    with sessions.begin() as s:
        sub = jobs.create(s, root, _spec({"name": "quick", "resources": _a100(1), "workers": ["sleep 3"]}))
        assert sub.job is not None
        sub.job.created_at -= timedelta(minutes=1)  # created a while before its node's next beat
        job_id = sub.job.id
    with sessions.begin() as s:
        _report(s, _node_of(s, job_id, 0), job_id, 0, "exited", exit_code=0, ran_s=3.0)
        job = s.get_one(Job, job_id)
        (worker,) = job.workers
        assert job.state == "succeeded" and job.started_at is None  # never seen running
        assert worker.started_at is not None and worker.ended_at is not None
        assert worker.ended_at - worker.started_at == timedelta(seconds=3)
        metering.meter(s, worker.ended_at + timedelta(seconds=1))
    with sessions() as s:
        (entry,) = s.scalars(select(LedgerEntry).where(LedgerEntry.job_id == job_id))
        # the owner's own A100: the datacenter usage fee, 0.25 per GPU-hour, for 3 s
        assert Decimal(entry.amount_micros) / 10**6 == (Decimal("0.25") * 3 / 3600).quantize(
            Decimal("0.000001")
        )


@pytest.mark.parametrize(
    ("addresses", "observed", "hostname", "expected"),
    [
        # a control plane on the region's LAN sees the node's own address: that one
        ([("eno1", "10.0.0.5"), ("podman0", "10.88.0.1")], "10.0.0.5", None, "10.0.0.5"),
        # behind NAT it sees the router's: the node's own private address on its NIC instead
        ([("podman0", "10.88.0.1"), ("eno1", "192.168.1.20")], "203.0.113.5", "n.example", "192.168.1.20"),
        # no physical NIC listed (a lab namespace): any interface but a container bridge
        ([("cni-podman0", "10.88.0.1"), ("lan0", "10.77.0.11")], "198.51.100.1", None, "10.77.0.11"),
        # a node that reports no addresses: the operator's hostname, then where it beats from
        ([], "10.0.0.9", "gpu-7.lan", "gpu-7.lan"),
        ([], "10.0.0.9", None, "10.0.0.9"),
    ],
)
def test_a_peers_address_is_the_nodes_own_in_the_region(
    addresses: list[tuple[str, str]], observed: str, hostname: str | None, expected: str
) -> None:
    inventory = {
        "addresses": [{"interface": i, "address": a} for i, a in addresses],
        "nics": [{"name": "eno1"}],
        "observed_address": observed,
    }
    node = Node(name="n", minion_id="0" * 32, hostname=hostname, inventory=inventory)
    assert job_peers.address_of(node) == expected


def test_a_gang_starts_only_once_every_peer_has_an_address(store: Store) -> None:
    """A gang's worker is not sent to its node until every worker's node has an address; a single
    worker is sent at once."""
    sessions: sessionmaker[Session] = store.sessions  # type: ignore[assignment]
    root = _fleet(sessions)
    with sessions.begin() as s:
        n2 = nodes.get(s, "n2")
        n2.inventory = {k: v for k, v in (n2.inventory or {}).items() if k != node_address.KEY}
    spec = _spec({"name": "ddp", "kind": "gang", "resources": _a100(2), "workers": ["x"] * 3})
    with sessions.begin() as s:
        sub = jobs.create(s, root, spec)
        assert sub.job is not None and sub.job.state == "starting"
        job_id = sub.job.id
    with sessions.begin() as s:
        assert all(not _desired(s, n) for n in NODES)  # n2 has no address yet: nobody starts
        node_address.record(nodes.get(s, "n2"), "10.9.0.12")  # its next beat says where it is
    with sessions.begin() as s:
        assert all(len(_desired(s, n)) == 1 for n in NODES)
        assert {w["worker"] for n in NODES for w in _desired(s, n) if w["job_id"] == job_id} == {0, 1, 2}


def test_a_waiting_job_the_fleet_shrank_under_is_marked_unplaceable(store: Store) -> None:
    sessions: sessionmaker[Session] = store.sessions  # type: ignore[assignment]
    root = _fleet(sessions)
    with sessions.begin() as s:  # all six GPUs busy: a gang of 3 x 2 waits for them
        busy = jobs.create(s, root, _spec({"name": "busy", "resources": _a100(2), "workers": ["x"] * 3}))
        assert busy.job is not None and busy.job.state == "starting"
        later = jobs.create(s, root, _spec({"name": "later", "resources": _a100(2), "workers": ["x"] * 3}))
        assert later.job is not None and later.job.state == "waiting"
        assert later.job.reason is not None and later.job.reason.startswith("Waiting for GPUs: the gang's 3")
        later_id = later.job.id
    with sessions.begin() as s:  # one node leaves the fleet: 4 GPUs can never hold 3 x 2
        nodes.transition(s, nodes.get(s, "n2"), NodeState.MAINTENANCE, actor=ACTOR)
        nodes.transition(s, nodes.get(s, "n2"), NodeState.REMOVED, actor=ACTOR)
    with sessions.begin() as s:
        jobs.place_waiting(s, s.get_one(Job, later_id), actor=ACTOR)
        job = s.get_one(Job, later_id)
        assert job.state == "waiting"  # nodes may join: it waits, saying why it cannot start as things are
        assert job.reason is not None and job.reason.startswith(
            "Unplaceable: the gang's 3 workers need 6 GPUs"
        )
