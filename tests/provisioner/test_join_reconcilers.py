"""The reconcilers the join hands over to, stepped with ReconcilerLoop.run_once() on a real migrated
store: finalize (a lab node's playbook through ansible-runner; a failure → errored with the failing task
and the task events in the node's history), region health from heartbeats, and the loop's lifetime in
the server process."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from provisioner.api.app import create_app
from provisioner.domain.states import NodeState, RegionState
from provisioner.reconcilers import region_health
from provisioner.reconcilers.loop import ReconcilerLoop
from provisioner.services import audit, nodes, providers, regions
from provisioner.store.engine import make_engine, make_sessionmaker, session_scope
from provisioner.store.migrate import upgrade


@pytest.fixture
def sessions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> sessionmaker[Session]:
    monkeypatch.setenv("RIGBASE_HOME", str(tmp_path / "home"))
    url = f"sqlite:///{tmp_path / 'rigbase.db'}"
    engine = make_engine(url)
    upgrade(url, engine)
    factory = make_sessionmaker(engine)
    with session_scope(factory) as s:
        providers.enable(s, "physical", {}, actor="test")
        regions.create(s, "lab", provider="physical", actor="test")
    return factory


def _node_in_provisioning(sessions: sessionmaker[Session], lab_root: Path, hostname: str = "n1") -> str:
    with session_scope(sessions) as s:
        node = nodes.add(s, "n1", region="lab", minion_id="a" * 32, hostname=hostname, actor="test")
        node.lab_root = str(lab_root)
        for state in (NodeState.ENROLLING, NodeState.PROVISIONING):
            nodes.transition(s, node, state, actor="test")
        return node.id


def test_a_failed_finalize_errors_the_node_with_the_failing_task(
    sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    """A lab root whose python3 cannot run (an empty file): the first task that runs inside the chroot
    fails, and that task's name is the node's reason. The reconciler keeps no memory, so a restarted
    control plane finds the node in provisioning and runs the playbook again — the same pass as here.
    (The converging run into a debootstrap'd root is tests/provisioner/test_finalize.py's.)"""
    root = tmp_path / "broken-root"
    python = root / "usr" / "bin" / "python3"
    python.parent.mkdir(parents=True)
    python.write_text("")
    python.chmod(0o755)
    node_id = _node_in_provisioning(sessions, root)
    ReconcilerLoop(sessions, only=["finalize"]).run_once()
    with session_scope(sessions) as s:
        node = nodes.get(s, node_id)
        assert node.state == NodeState.ERRORED
        assert node.reason.startswith("finalize failed at task '"), node.reason
        events = [
            e.reason or "" for e in audit.history(s, "node", [node_id]) if e.actor == "reconciler:finalize"
        ]
    assert any(": failed" in e or "unreachable" in e for e in events), events


def test_a_storage_node_exports_its_cache_to_the_region_networks(sessions: sessionmaker[Session]) -> None:
    """Nothing sets a region's `nfs_clients` unless the operator does, and the storage playbook refuses
    an empty list: the request must default to the private (RFC 1918) ranges the region's nodes use,
    and follow the region setting when there is one."""
    from provisioner.reconcilers.finalize import DEFAULT_NFS_CLIENTS, request_for

    cp_url = "http://127.0.0.1:8470"  # the node-facing URL, beside the point here

    with session_scope(sessions) as s:
        node = nodes.add(s, "store1", region="lab", minion_id="b" * 32, service="storage", actor="test")
        assert list(request_for(node, cp_url).nfs_clients) == [
            "10.0.0.0/8",
            "172.16.0.0/12",
            "192.168.0.0/16",
        ]
        assert tuple(request_for(node, cp_url).nfs_clients) == DEFAULT_NFS_CLIENTS
        node.region.settings = {**(node.region.settings or {}), "nfs_clients": ["10.77.0.0/24"]}
        assert list(request_for(node, cp_url).nfs_clients) == ["10.77.0.0/24"]


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
