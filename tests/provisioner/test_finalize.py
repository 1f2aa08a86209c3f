"""Finalize for real: ansible-runner runs the finalize playbooks through the community.general.chroot
connection into a debootstrap'd bookworm root, exactly as the lab does.

The base root is built once per test session (~35-50 s, cached by its inputs) and cloned per test.
RIGBASE_TEST_ROOTFS_CACHE=/some/dir keeps it across sessions while developing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from provisioner.adapters import ansible as finalize
from provisioner.adapters.ansible import ChrootTarget, FinalizeEvent, FinalizeRequest, TaskStatus
from provisioner.lab import rootfs

DRIVES = [
    {"path": "/dev/nvme0n1", "size_bytes": 10**12, "system": True},
    {"path": "/dev/nvme1n1", "size_bytes": 2 * 10**12},
    {"path": "/dev/nvme2n1", "size_bytes": 2 * 10**12},
]
CP = "https://10.77.0.1:8470"


def _plugin():  # the playbooks' own filter, to compare the written layout with
    spec = importlib.util.spec_from_file_location(
        "rigbase_scratch", finalize.PLAYBOOK_DIR / "filter_plugins" / "rigbase_scratch.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def base_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = Path(os.environ.get("RIGBASE_TEST_ROOTFS_CACHE") or tmp_path_factory.mktemp("rootfs-cache"))
    return rootfs.ensure_base(cache=cache)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "home"
    monkeypatch.setenv("RIGBASE_HOME", str(path))
    return path


@pytest.fixture
def root(base_root: Path, home: Path) -> Path:
    path = rootfs.clone(base_root, home / "lab" / "roots" / "n1")
    yield path
    rootfs.remove_root(path)


def compute(**changes: object) -> FinalizeRequest:
    fields: dict = dict(
        node_name="n1",
        hostname="n1.lab.example",
        service="compute",
        region="lab",
        control_plane_url=CP,
        nvme_drives=DRIVES,
    )
    return FinalizeRequest(**(fields | changes))


def run(request: FinalizeRequest, root: Path) -> tuple[finalize.FinalizeResult, list[FinalizeEvent]]:
    events: list[FinalizeEvent] = []
    return finalize.run_finalize(request, ChrootTarget(root), events.append), events


def test_compute_finalize_converges_and_a_second_run_changes_nothing(root: Path) -> None:
    host_name = socket.gethostname()
    first, events = run(compute(), root)
    assert first.ok, first
    assert first.changed > 0
    assert first.artifact_dir.is_dir() and str(first.artifact_dir).startswith(os.environ["RIGBASE_HOME"])

    # every task reached the callback, started then finished, for this node
    finished = {e.task: e.status for e in events if e.status is not TaskStatus.STARTED}
    started = {e.task for e in events if e.status is TaskStatus.STARTED}
    assert set(finished) == started
    assert {e.host for e in events} == {"n1"}
    assert finished["Write the minion configuration"] is TaskStatus.CHANGED
    # lab mode: device and running-service steps are skipped, explicitly
    for task in (
        "Partition the scratch drives",
        "Assemble the scratch RAID0",
        "Make the scratch filesystem",
        "Mount the scratch volume",
        "Set the running hostname",
    ):
        assert finished[task] is TaskStatus.SKIPPED, task
    assert socket.gethostname() == host_name  # the chroot shares the host's UTS namespace

    # what the node got
    assert (root / "etc/hostname").read_text() == "n1\n"
    assert "127.0.1.1\tn1.lab.example n1" in (root / "etc/hosts").read_text().splitlines()
    layout = yaml.safe_load((root / "etc/rigbase/scratch.yaml").read_text())
    expected = _plugin().scratch_layout(DRIVES[1:]) | {"applied": False}
    assert layout == expected and layout["kind"] == "raid0"
    assert layout["raid"]["members"] == ["/dev/nvme1n1p1", "/dev/nvme2n1p1"]
    assert expected["fstab"] in (root / "etc/fstab").read_text().splitlines()
    assert (root / "scratch").is_dir()
    minion = yaml.safe_load((root / "etc/rigbase/minion.yaml").read_text())
    assert minion["control_plane_url"] == CP and minion["node_name"] == "n1" and minion["region"] == "lab"
    unit = root / "etc/systemd/system/rigbase-minion.service"
    assert "WantedBy=multi-user.target" in unit.read_text()
    link = root / "etc/systemd/system/multi-user.target.wants/rigbase-minion.service"
    assert os.readlink(link) == "/etc/systemd/system/rigbase-minion.service"

    second, events = run(compute(), root)
    assert second.ok and second.changed == 0, [e for e in events if e.status is TaskStatus.CHANGED]
    assert not [e for e in events if e.status is TaskStatus.CHANGED]

    # inputs change (the drives were pulled): the layout and fstab follow, no stale entry is left
    third, _ = run(compute(nvme_drives=[]), root)
    assert third.ok and third.changed > 0
    assert yaml.safe_load((root / "etc/rigbase/scratch.yaml").read_text())["kind"] == "none"
    assert "/scratch" not in (root / "etc/fstab").read_text()


def test_storage_finalize_exports_the_region_cache(root: Path) -> None:
    request = compute(service="storage", nfs_clients=["10.77.0.0/24", "10.78.0.0/24"])
    first, events = run(request, root)
    assert first.ok, first
    exports = (root / "etc/exports.d/rigbase-cache.exports").read_text().splitlines()
    assert (
        "/scratch/cache 10.77.0.0/24(rw,sync,no_subtree_check,root_squash) "
        "10.78.0.0/24(rw,sync,no_subtree_check,root_squash)" in exports
    )
    assert (root / "scratch/cache").is_dir()
    finished = {e.task: e.status for e in events if e.status is not TaskStatus.STARTED}
    assert finished["Install the NFS server"] is TaskStatus.SKIPPED
    assert finished["Enable the NFS server"] is TaskStatus.SKIPPED
    second, _ = run(request, root)
    assert second.ok and second.changed == 0


def test_storage_without_client_networks_fails_before_exporting(root: Path) -> None:
    result, _ = run(compute(service="storage"), root)
    assert not result.ok
    assert result.failed_task == "Check the NFS clients of the region cache"
    assert "client networks" in result.message
    assert not (root / "etc/exports.d/rigbase-cache.exports").exists()


def test_an_invalid_hostname_fails_with_that_task_and_changes_nothing(root: Path) -> None:
    result, events = run(compute(hostname="n1_lab!"), root)
    assert not result.ok and result.status == "failed"
    assert result.failed_task == "Check the hostname is a valid DNS name"
    assert '"n1_lab!" is not a valid hostname' in result.message
    failed = [e for e in events if e.status is TaskStatus.FAILED]
    assert [e.task for e in failed] == [result.failed_task]
    assert not (root / "etc/rigbase").exists()  # preflight runs before any change


def test_an_unwritable_path_fails_with_that_task_and_a_retry_converges(root: Path) -> None:
    # a plain file where the configuration directory goes: a real filesystem error on the node
    (root / "etc/rigbase").write_text("in the way\n")
    result, _ = run(compute(), root)
    assert not result.ok
    assert result.failed_task == "Create the rigbase configuration directory"
    assert "rigbase" in result.message
    (root / "etc/rigbase").unlink()  # the operator fixes the node, then `provision node retry`
    retry, _ = run(compute(), root)
    assert retry.ok, retry
    assert (root / "etc/rigbase/minion.yaml").is_file()


def test_lab_mode_must_match_the_connection(root: Path) -> None:
    # a lab root presented as a real node would have its device steps run against the host
    result, _ = run(compute(extra_vars={"rigbase_lab": False}), root)
    assert not result.ok
    assert result.failed_task == "Check lab mode matches the connection"
    assert not (root / "etc/rigbase").exists()


def test_a_run_killed_mid_play_then_rerun_converges(root: Path, home: Path, tmp_path: Path) -> None:
    node = tmp_path / "node.json"
    node.write_text(
        json.dumps(
            dict(
                node_name="n1",
                hostname="n1.lab.example",
                service="compute",
                region="lab",
                control_plane_url=CP,
                nvme_drives=DRIVES,
            )
        )
    )
    # the control plane's process, killed with SIGKILL after the play has changed something
    proc = subprocess.Popen(
        [sys.executable, "-m", "provisioner.adapters.ansible", str(node), "--chroot", str(root)],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ | {"RIGBASE_HOME": str(home)},
        cwd=Path(__file__).parents[2],
    )
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        event = json.loads(line)
        seen.append(event)
        if event["task"] == "Write /etc/hostname" and event["status"] == "changed":
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert seen[-1]["task"] == "Write /etc/hostname", seen  # killed mid-play, not after it
    assert not (root / "etc/rigbase/minion.yaml").exists()

    rerun, events = run(compute(), root)
    assert rerun.ok, rerun
    assert (root / "etc/rigbase/minion.yaml").is_file()
    assert not (home / "ansible/n1/playbook.pid").exists()
    # no ansible-playbook of the killed run is left to race the re-run
    leftovers = subprocess.run(["pgrep", "-f", f"ansible-playbook.*{home}"], capture_output=True, text=True)
    assert leftovers.stdout.strip() == ""
    again, _ = run(compute(), root)
    assert again.ok and again.changed == 0


def test_a_leftover_playbook_is_stopped_before_a_rerun(home: Path) -> None:
    # what a crashed control plane leaves: a playbook in its own session, its pid recorded
    leftover = subprocess.Popen(["sleep", "300"], start_new_session=True)
    pid_file = home / "pid"
    home.mkdir(parents=True, exist_ok=True)
    finalize._record_pid(pid_file, leftover.pid)
    finalize._stop_leftover(pid_file)
    assert leftover.wait(timeout=10) == -signal.SIGTERM
    assert not pid_file.exists()
    # a recycled pid (same number, another start time) is left alone
    other = subprocess.Popen(["sleep", "300"], start_new_session=True)
    pid_file.write_text(f"{other.pid} 1\n")
    finalize._stop_leftover(pid_file)
    time.sleep(0.2)
    assert other.poll() is None
    other.kill()
    other.wait()


def test_a_second_concurrent_run_of_the_same_node_is_refused(root: Path, home: Path) -> None:
    from contracts.errors import Conflict

    data_dir = home / "ansible" / "n1"
    data_dir.mkdir(parents=True)
    with finalize._node_lock(data_dir, "n1"):  # another control-plane worker holds the node
        with pytest.raises(Conflict, match="already running"):
            run(compute(), root)


def test_rootfs_clones_are_private_and_removed_cleanly(base_root: Path, home: Path) -> None:
    a = rootfs.root_for_node("a", home=home, cache=base_root.parents[1])
    b = rootfs.root_for_node("b", home=home, cache=base_root.parents[1])
    assert rootfs.root_for_node("a", home=home, cache=base_root.parents[1]) == a  # idempotent
    (a / "etc/hostname").write_text("a\n")
    assert (b / "etc/hostname").read_text() != "a\n"
    assert (base_root / "etc/hostname").read_text() != "a\n"
    # a rename over a hardlinked /usr file (how dpkg and Ansible write) leaves the base alone
    before = (base_root / "usr/lib/os-release").read_text()
    tmp = a / "usr/lib/os-release.new"
    tmp.write_text("changed\n")
    tmp.rename(a / "usr/lib/os-release")
    assert (base_root / "usr/lib/os-release").read_text() == before
    rootfs.remove_root(a)
    assert not a.exists() and b.exists()
    with pytest.raises(Exception, match="not a rigbase lab root"):
        rootfs.remove_root(base_root)
    assert base_root.exists()
    rootfs.remove_root(b)


def test_an_unreachable_real_node_fails_with_the_first_task_that_connects(home: Path, tmp_path: Path) -> None:
    # a real node over SSH whose sshd is down: a closed port on loopback
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    events: list[FinalizeEvent] = []
    result = finalize.run_finalize(compute(), finalize.SshTarget("127.0.0.1", key, port=port), events.append)
    assert not result.ok
    # the preflight checks run on the control plane; the first task on the node can't connect
    assert result.failed_task == "Create the rigbase configuration directory"
    assert [e.status for e in events if e.task == result.failed_task][-1] is TaskStatus.UNREACHABLE
    assert "Connection refused" in result.message
