"""The reconcilers the join hands over to, stepped with ReconcilerLoop.run_once() on a real migrated
store: finalize (a node whose minion never reports its finalize errors after the timeout; the variables
its work carries), region health from heartbeats, and the loop's lifetime in the server process."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from provisioner.api.app import create_app
from provisioner.domain.states import NodeState, RegionState
from provisioner.reconcilers import region_health
from provisioner.reconcilers.loop import ReconcilerLoop
from provisioner.services.common import audit
from provisioner.services.common.wakeups import Wake
from provisioner.services.fleet import finalize, node_address, nodes
from provisioner.services.regions import providers, regions
from provisioner.store.engine import make_engine, make_sessionmaker, session_scope
from provisioner.store.migrate import upgrade
from tests.fixtures.postgres import seed_sqlite


@pytest.fixture
def sessions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> sessionmaker[Session]:
    monkeypatch.setenv("RIGBASE_HOME", str(tmp_path / "home"))
    seed_sqlite(tmp_path / "rigbase.db")
    url = f"sqlite:///{tmp_path / 'rigbase.db'}"
    engine = make_engine(url)
    upgrade(url, engine)
    factory = make_sessionmaker(engine)
    with session_scope(factory) as s:
        providers.enable(s, "physical", {}, actor="test")
        regions.create(s, "lab", provider="physical", actor="test")
    return factory


def _node_in_provisioning(sessions: sessionmaker[Session], name: str = "n1", region: str = "lab") -> str:
    with session_scope(sessions) as s:
        node = nodes.add(s, name, region=region, minion_id=f"{len(name):x}" * 32, actor="test")
        for state in (NodeState.ENROLLING, NodeState.PROVISIONING):
            nodes.transition(s, node, state, actor="test")
        return node.id


def test_a_node_without_finalize_reports_times_out(
    sessions: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The minion finalizes its own node; a node that stays in provisioning without a report for the
    settings' finalize_timeout_s errors with a reason that says what to check. A report restarts the
    wait. The reconciler keeps no memory: a restarted control plane computes the same deadlines."""
    monkeypatch.setenv("RIGBASE_FINALIZE_TIMEOUT_S", "1")
    node_id = _node_in_provisioning(sessions)
    ReconcilerLoop(sessions, only=[Wake.FINALIZE]).run_once()
    with session_scope(sessions) as s:
        node = nodes.get(s, node_id)
        assert node.state == NodeState.PROVISIONING  # within the timeout
        entered = finalize.waiting_since(s, node)
        # a report (any: events only) restarts the wait
        node.finalize_reported_at = entered + timedelta(seconds=30)
        assert not finalize.time_out(s, node, timeout_s=60, now=entered + timedelta(seconds=80), actor="t")
        node.finalize_reported_at = None
    time.sleep(1.1)
    ReconcilerLoop(sessions, only=[Wake.FINALIZE]).run_once()
    with session_scope(sessions) as s:
        node = nodes.get(s, node_id)
        assert node.state == NodeState.ERRORED
        reason = node.reason or ""
        assert reason.startswith("no finalize report from the minion within"), reason
        assert f"provision node retry {node.name}" in reason
        assert audit.history(s, "node", [node_id])[-1].actor == "reconciler:finalize"


def test_finalize_variables_follow_the_region_and_its_storage_node(sessions: sessionmaker[Session]) -> None:
    """A storage node exports the cache to the RFC 1918 ranges unless the region says otherwise (the
    storage playbook refuses an empty list); a compute node of a central region mounts its storage node
    at the operator's hostname, else where its minion connects from; a retry is a new generation."""
    with session_scope(sessions) as s:
        regions.create(s, "hub", provider="physical", storage_mode="central", actor="test")
        store = nodes.add(s, "store1", region="hub", minion_id="b" * 32, service="storage", actor="test")
        cp_url = "https://127.0.0.1:8470"
        variables = finalize.variables_for(s, store, cp_url)
        assert variables["rigbase_nfs_clients"] == list(finalize.DEFAULT_NFS_CLIENTS)
        assert variables["rigbase_nfs_server"] is None and variables["rigbase_storage_mode"] == "central"
        store.region.settings = {**(store.region.settings or {}), "nfs_clients": ["10.77.0.0/24"]}
        assert finalize.variables_for(s, store, cp_url)["rigbase_nfs_clients"] == ["10.77.0.0/24"]
        for state in (NodeState.ENROLLING, NodeState.PROVISIONING, NodeState.ACTIVE):
            nodes.transition(s, store, state, actor="test")
        node_address.record(store, "10.1.2.3")
        gpu = nodes.add(s, "gpu1", region="hub", minion_id="c" * 32, actor="test")
        assert finalize.variables_for(s, gpu, cp_url)["rigbase_nfs_server"] == "10.1.2.3"
        store.hostname = "nas.hub.lan"
        assert finalize.variables_for(s, gpu, cp_url)["rigbase_nfs_server"] == "nas.hub.lan"
        for state in (NodeState.ENROLLING, NodeState.PROVISIONING):
            nodes.transition(s, gpu, state, actor="test")
        before = finalize.work_for(s, gpu)
        finalize.next_attempt(gpu)
        after = finalize.work_for(s, gpu)
        assert before is not None and after is not None
        assert after.generation != before.generation and after.variables == before.variables


def test_region_health_follows_heartbeats(sessions: sessionmaker[Session], tmp_path: Path) -> None:
    with session_scope(sessions) as s:
        node = nodes.add(s, "n1", region="lab", minion_id="b" * 32, actor="test")
        region_health.refresh(s)
        assert regions.get(s, "lab").state == RegionState.NEW  # nobody reported yet
        nodes.record_report(s, node)
        region_health.refresh(s)
        assert regions.get(s, "lab").state == RegionState.HEALTHY
        region_health.refresh(s, now=datetime.now(UTC) + timedelta(minutes=5))
        assert regions.get(s, "lab").state == RegionState.OFFLINE


def test_the_server_runs_the_reconciler_loop_only_when_asked(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'rigbase.db'}"
    with TestClient(create_app(url)):
        assert not [t for t in threading.enumerate() if t.name.startswith("reconcile-")]
    with TestClient(create_app(url, reconcilers=True)):
        running = {t.name for t in threading.enumerate() if t.name.startswith("reconcile-")}
        assert {"reconcile-finalize", "reconcile-region-health"} <= running
    assert not [t for t in threading.enumerate() if t.name.startswith("reconcile-") and t.is_alive()]
