"""A control plane killed mid-playbook, restarted: the finalize reconciler re-runs the playbook and the
node converges (issue 4). The first control plane is a real child process running one reconciler pass
against the same store; it is SIGKILLed once the node's history shows playbook task events, so its
ansible-playbook (in its own session) may still be running. A fresh ReconcilerLoop on a new engine — what
`provision serve` builds after a restart — must find the node still in provisioning, re-run the playbook
with no leftover racing it, and finish the node. (Stopping a leftover that lives on is
test_finalize.py's test_a_leftover_playbook_is_stopped_before_a_rerun.)

The lab root is a clone of the cached debootstrap root (RIGBASE_TEST_ROOTFS_CACHE, as in
tests/provisioner/test_finalize.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from provisioner.adapters import ansible as finalize
from provisioner.domain.states import NodeState
from provisioner.lab import rootfs
from provisioner.reconcilers.loop import ReconcilerLoop
from provisioner.services import audit, nodes, providers, regions
from provisioner.store.engine import make_engine, make_sessionmaker, session_scope
from provisioner.store.migrate import upgrade

CP = "https://10.77.0.1:8470"
ACTOR = "reconciler:finalize"
# the killed control plane: one finalize pass, exactly as `provision serve`'s loop thread runs it
CONTROL_PLANE = """
import sys
from provisioner.reconcilers.loop import ReconcilerLoop
from provisioner.store.engine import make_engine, make_sessionmaker
ReconcilerLoop(make_sessionmaker(make_engine(sys.argv[1])), only=["finalize"]).run_once()
"""


@pytest.fixture(scope="module")
def base_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = Path(os.environ.get("RIGBASE_TEST_ROOTFS_CACHE") or tmp_path_factory.mktemp("rootfs-cache"))
    return rootfs.ensure_base(cache=cache)


def _history(url: str, node_id: str) -> list[str]:
    """The finalize reconciler's history lines, read through an engine of its own (a third process's view)."""
    engine = make_engine(url)
    try:
        with session_scope(make_sessionmaker(engine)) as s:
            return [e.reason or "" for e in audit.history(s, "node", [node_id]) if e.actor == ACTOR]
    finally:
        engine.dispose()


def _playbooks_of(home: Path) -> list[str]:
    found = subprocess.run(["pgrep", "-f", f"ansible-playbook.*{home}"], capture_output=True, text=True)
    return found.stdout.split()


def test_a_control_plane_killed_mid_playbook_finishes_the_node_after_restart(
    base_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("RIGBASE_HOME", str(home))
    monkeypatch.setenv("RIGBASE_PUBLIC_URL", CP)
    root = rootfs.root_for_node("n1", home=home, cache=base_root.parents[1])
    url = f"sqlite:///{tmp_path / 'rigbase.db'}"
    engine = make_engine(url)
    upgrade(url, engine)
    with session_scope(make_sessionmaker(engine)) as s:
        providers.enable(s, "physical", {}, actor="test")
        regions.create(s, "lab", provider="physical", actor="test")
        node = nodes.add(s, "n1", region="lab", minion_id="c" * 32, hostname="n1.lab.example", actor="test")
        node.lab_root = str(root)
        for state in (NodeState.ENROLLING, NodeState.PROVISIONING):
            nodes.transition(s, node, state, actor="test")
        node_id = node.id
    engine.dispose()

    try:
        # the first control plane, killed once the playbook has reported tasks
        proc = subprocess.Popen(
            [sys.executable, "-c", CONTROL_PLANE, url], env=dict(os.environ), cwd=Path(__file__).parents[2]
        )
        deadline = time.monotonic() + 120
        while not [h for h in _history(url, node_id) if h.startswith("task ")]:
            assert proc.poll() is None, "the first control plane exited before any playbook task was recorded"
            assert time.monotonic() < deadline, "no playbook task event within 120 s"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL
        before = _history(url, node_id)
        assert not [h for h in before if h.startswith("finalized")], before  # killed mid-play
        pid_file = home / "ansible/n1/playbook.pid"
        # its ansible-playbook was recorded for the next run to stop; it may still be running (in practice
        # it dies of SIGHUP ~0.1 s later, when the dead process's pty closes, half applied)
        leftover_pid, leftover_start = (int(f) for f in pid_file.read_text().split())

        # the restarted control plane: new engine, new sessions, a fresh loop
        engine = make_engine(url)
        sessions = make_sessionmaker(engine)
        with session_scope(sessions) as s:
            assert nodes.get(s, node_id).state == NodeState.PROVISIONING  # nothing moved it on
        ReconcilerLoop(sessions, only=["finalize"]).run_once()
        with session_scope(sessions) as s:
            node = nodes.get(s, node_id)
            assert node.state == NodeState.MAINTENANCE, (node.state, node.reason)
        engine.dispose()

        after = _history(url, node_id)[len(before) :]
        assert [h for h in after if h.startswith("finalized in ")] == after[-1:], after
        assert [h for h in after if h.startswith("task ")], after  # the playbook really ran again
        assert not [h for h in after if ": failed" in h or ": unreachable" in h], after
        # the killed run's playbook is gone, its pid record cleared, and no ansible-playbook is left for
        # this home
        assert finalize.process_start_time(leftover_pid) != leftover_start
        assert not pid_file.exists()
        assert _playbooks_of(home) == []
        minion = yaml.safe_load((root / "etc/rigbase/minion.yaml").read_text())
        assert minion["control_plane_url"] == CP and minion["node_name"] == "n1" and minion["region"] == "lab"
    finally:
        for pid in _playbooks_of(home):  # a failed assertion must not leave a play running
            os.killpg(os.getpgid(int(pid)), signal.SIGKILL)
        rootfs.remove_root(root)
