"""Permanent GCP compute nodes, in-process: the real store, the real google-cloud-compute client
against the Compute REST fake, one gcp-burst pass at a time. The VM has the shape of its GPU count, uses
only the named reservation, boots the region's published image, gets its EK pinned, is never reaped, and
goes when its node is removed; every refusal leaves nothing behind."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from contracts.errors import Conflict, InvalidInput, RuleViolation
from provisioner.domain.states import BurstVmState, NodeState
from provisioner.providers.base import NodeEvent, NodeEventKind
from provisioner.reconcilers import gcp_burst as burst_reconciler
from provisioner.services.cloud import gcp_burst
from provisioner.services.fleet import nodes as node_service
from provisioner.services.jobs import gcp_events
from provisioner.services.regions import providers as provider_service
from provisioner.services.regions import regions as region_service
from provisioner.store.engine import session_scope
from provisioner.store.gcp_models import GcpBurstVm, GcpStorageNode
from provisioner.store.models import Node
from tests.provisioner.gcp.test_burst import burst_pass, world
from tests.provisioner.gcp.test_reconcilers import regions_pass

ACTOR = "operator:test"


@pytest.fixture()
def store(tmp_path: Path, fake_compute: Any) -> Iterator[sessionmaker[Session]]:
    """us-central1 with its image published and its storage node active (compute nodes need it)."""
    for sessions in world(f"sqlite:///{tmp_path / 'rigbase.db'}", tmp_path, fake_compute):
        regions_pass(sessions)
        with session_scope(sessions) as s:
            (rec,) = s.scalars(select(GcpStorageNode))
            node = s.get_one(Node, rec.node_id)
            for to in (NodeState.ENROLLING, NodeState.PROVISIONING, NodeState.MAINTENANCE, NodeState.ACTIVE):
                node_service.transition(s, node, to, actor="test:join")
        burst_pass(sessions)  # reads the quota cache, as the server does within seconds of starting
        yield sessions


def add(sessions: sessionmaker[Session], name: str, **kw: Any) -> dict[str, Any]:
    with session_scope(sessions) as s:
        out = gcp_burst.add_compute_node(s, name, region=kw.pop("region", "us-central1"), actor=ACTOR, **kw)
        return {k: (v.id if isinstance(v, Node) else v) for k, v in out.items()}


def vm_of(sessions: sessionmaker[Session], vm_id: str) -> GcpBurstVm:
    with session_scope(sessions) as s:
        vm = s.get_one(GcpBurstVm, vm_id)
        s.expunge(vm)
        return vm


def test_a_reserved_a100_node_gets_its_shape_joins_as_that_vm_and_goes_when_removed(
    store: sessionmaker[Session], fake_compute: Any
) -> None:
    fake = fake_compute.fake
    out = add(store, "train-1", gpu_type="A100", gpu_count=2, reservation="a100-commit-1y")
    assert (out["machine_type"], out["billing"]) == ("a2-highgpu-2g", "the reservation's committed price")
    burst_pass(store)
    vm = vm_of(store, out["vm_id"])
    assert vm.state == BurstVmState.CREATED and vm.job_id is None
    inst = fake.instances[(vm.zone, out["instance"])]
    assert out["instance"] == "rigbase-us-central1-train-1"
    assert inst["machineType"].endswith("/machineTypes/a2-highgpu-2g")
    assert inst.get("guestAccelerators", []) == []  # A2 machine types bring their GPUs
    assert inst["reservationAffinity"] == {
        "consumeReservationType": "SPECIFIC_RESERVATION",
        "key": "compute.googleapis.com/reservation-name",
        "values": ["a100-commit-1y"],
    }
    assert inst["scheduling"]["onHostMaintenance"] == "TERMINATE"
    assert inst["scheduling"].get("provisioningModel") == "STANDARD"
    assert inst["labels"]["rigbase-job"] == "none" and inst["labels"]["rigbase-role"] == "compute"
    boot = next(d for d in inst["disks"] if d.get("boot"))
    assert boot["initializeParams"]["sourceImage"].endswith("/images/family/rigbase-us-central1")
    assert "compute node train-1" in inst["description"]
    with session_scope(store) as s:
        node = s.get_one(Node, out["node"])
        assert node.name == "train-1" and node.state == NodeState.NEW and node.service == "compute"
        assert node.pinned_ek_public is not None and vm.reason and node.minion_id in vm.reason
    # it stays: more passes, and the reaper, leave it alone (a live row owns it)
    burst_pass(store)
    ctx, prefix = burst_reconciler._context(store)
    assert ctx is not None and burst_reconciler.reap(store, ctx, prefix) == []
    assert (vm.zone, out["instance"]) in fake.instances
    # removing the node deletes the VM
    with session_scope(store) as s:
        node_service.transition(s, s.get_one(Node, out["node"]), NodeState.REMOVED, actor=ACTOR)
    burst_pass(store)
    burst_pass(store)
    assert vm_of(store, out["vm_id"]).state == BurstVmState.DELETED
    assert (vm.zone, out["instance"]) not in fake.instances


def test_an_on_demand_node_spends_the_quota_and_a_vm_deleted_outside_rigbase_removes_its_node(
    store: sessionmaker[Session], fake_compute: Any
) -> None:
    dry = add(store, "t4-1", gpu_type="T4", gpu_count=2, dry_run=True)
    assert dry["dry_run"] and dry["price_per_hour"] and dry["machine_type"].startswith("n1-standard-")
    with session_scope(store) as s:
        assert s.scalar(select(func.count()).select_from(GcpBurstVm)) == 0
        assert node_service.by_minion_id(s, "x" * 32) is None
    out = add(store, "t4-1", gpu_type="T4", gpu_count=2)
    # the project's 2 T4s are now spent: another on-demand T4 node is refused before anything is stored
    with pytest.raises(RuleViolation, match="no capacity for 1 T4"):
        add(store, "t4-2", gpu_type="T4", gpu_count=1)
    burst_pass(store)
    vm = vm_of(store, out["vm_id"])
    assert vm.state == BurstVmState.CREATED and vm.cpus == 2 * 8  # n1-standard-16
    inst = fake_compute.fake.instances[(vm.zone, out["instance"])]
    assert [a["acceleratorCount"] for a in inst["guestAccelerators"]] == [2]  # N1 attaches them
    assert "reservationAffinity" not in inst
    gcp_events.apply_event(
        store,
        NodeEvent(
            NodeEventKind.DELETED,
            "deleted",
            out["instance"],
            vm.zone or "",
            "v1.compute.instances.delete",
            "t",
        ),
    )
    burst_pass(store)
    gone = vm_of(store, out["vm_id"])
    assert gone.state == BurstVmState.DELETED and "deleted outside rigbase" in (gone.reason or "")
    with session_scope(store) as s:
        assert s.get_one(Node, out["node"]).state == NodeState.REMOVED


def test_refusals_say_what_to_do_and_store_nothing(store: sessionmaker[Session], tmp_path: Path) -> None:
    with session_scope(store) as s:
        provider_service.enable(s, "physical", {}, actor=ACTOR)
        region_service.create(s, "lab", provider="physical", actor=ACTOR)
    add(store, "taken", gpu_type="A100", reservation="r1")
    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"region": "lab", "gpu_type": "A100"}, RuleViolation, "is a physical region: --gpu-type adds a VM"),
        ({"gpu_type": "K80"}, InvalidInput, "us-central1 offers"),
        ({"gpu_type": "A100", "gpu_count": 3}, InvalidInput, "has 1, 2, 4 or 8 GPUs"),
        ({"gpu_type": "A100", "reservation": "Bad_Name"}, InvalidInput, "is not a Compute reservation name"),
        ({"gpu_type": "A100", "reservation": "r1", "name": "taken"}, Conflict, "already exists"),
        ({"gpu_type": "A100"}, RuleViolation, "no capacity for 1 A100"),  # no A100 quota, no reservation
        ({"gpu_type": "A100", "name": "Not A Label", "reservation": "r1"}, InvalidInput, "DNS label"),
    ]
    with session_scope(store) as s:
        before = (
            s.scalar(select(func.count()).select_from(Node)),
            s.scalar(select(func.count()).select_from(GcpBurstVm)),
        )
    for kw, error, words in cases:
        with pytest.raises(error, match=words):
            add(store, kw.pop("name", "new-node"), **kw)
    with session_scope(store) as s:
        after = (
            s.scalar(select(func.count()).select_from(Node)),
            s.scalar(select(func.count()).select_from(GcpBurstVm)),
        )
    assert after == before


def test_node_add_needs_exactly_one_of_minion_id_and_gpu_type(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    provision = str(Path(sys.executable).parent / "provision")
    for args, words in (
        ([], "--minion-id is required (or --gpu-type for a VM in a GCP region)"),
        (["--gpu-type", "A100", "--minion-id", "0" * 32], "leave out --minion-id"),
    ):
        r = subprocess.run(
            [provision, "node", "add", "n1", "--region", "us-central1", *args],
            capture_output=True,
            text=True,
            env={
                **{k: v for k, v in os.environ.items() if not k.startswith("RIGBASE_")},
                "RIGBASE_HOME": str(tmp_path),
            },
            check=False,
        )
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and words in lines[0], r.stderr
