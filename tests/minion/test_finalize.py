"""On-node finalize for real: the minion's runner (minion/finalize) runs the shipped playbooks from the
real bundle through ansible-runner and the community.general.chroot connection into a debootstrap'd
bookworm root, exactly as a lab minion started with --host-root does (rigbase_lab=true).

The base root is built once per test session (~35-50 s, cached by its inputs) and cloned per test;
RIGBASE_TEST_ROOTFS_CACHE=/some/dir keeps it across sessions."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import yaml

from contracts.finalize import FinalizeEvent, TaskStatus
from minion.finalize.apply import apply_work
from minion.finalize.paths import FinalizePaths
from minion.finalize.runner import RunResult
from tests.minion.finalize_helpers import BUNDLE, CP, NVME, SATA, base_root, plugin, root, tree, work

__all__ = ["base_root", "root"]  # fixtures

pytestmark = pytest.mark.slow


def run(w: object, root: Path, state: Path) -> tuple[RunResult, list[FinalizeEvent]]:
    events: list[FinalizeEvent] = []
    result = apply_work(w, BUNDLE.data, FinalizePaths(state), host_root=root, on_event=events.append)  # type: ignore[arg-type]
    return result, events


def finished(events: list[FinalizeEvent]) -> dict[str, TaskStatus]:
    return {e.task: e.status for e in events if e.status is not TaskStatus.STARTED}


def test_compute_finalize_converges_and_a_second_run_changes_nothing(root: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    host_name = socket.gethostname()
    first, events = run(work(), root, state)
    assert first.outcome.ok, first
    assert first.outcome.changed > 0
    assert first.artifact_dir is not None and first.artifact_dir.is_relative_to(state / "finalize" / "runner")
    done = finished(events)
    assert set(done) == {e.task for e in events if e.status is TaskStatus.STARTED}
    assert done["Write the minion configuration"] is TaskStatus.CHANGED
    # lab mode: device, tool and running-service steps are skipped, explicitly
    for task in (
        "Find the tools this node's finalize needs",
        "Partition the scratch drives",
        "Assemble the scratch RAID0",
        "Make the scratch filesystem",
        "Mount the scratch volume",
        "Assemble the data cache RAID5",
        "Mount the data cache",
        "Set the running hostname",
    ):
        assert done[task] is TaskStatus.SKIPPED, task
    assert socket.gethostname() == host_name  # the chroot shares the host's UTS namespace

    assert (root / "etc/hostname").read_text() == "n1\n"
    layout = yaml.safe_load((root / "etc/rigbase/scratch.yaml").read_text())
    assert layout == plugin().scratch_layout(NVME) | {"applied": False}
    minion = yaml.safe_load((root / "etc/rigbase/minion.yaml").read_text())
    assert minion["control_plane_url"] == CP and minion["node_name"] == "n1"
    # the minion is the image's: the play neither installs nor enables a unit for it
    assert not (root / "etc/systemd/system/rigbase-minion.service").exists()
    # what the minion reports as facts
    assert first.facts["scratch"]["device"] == "/dev/md/rigbase-scratch"
    assert first.facts["storage"]["cache"]["mountpoint"] == "/data/cache"
    # saved for apply-saved at boot
    assert (state / "finalize/saved/work.json").is_file()

    second, events = run(work(), root, state)
    assert second.outcome.ok and second.outcome.changed == 0, [
        e for e in events if e.status is TaskStatus.CHANGED
    ]

    third, _ = run(work(rigbase_nvme_drives=[]), root, state)  # the NVMe drives were pulled
    assert third.outcome.ok and third.outcome.changed > 0
    assert yaml.safe_load((root / "etc/rigbase/scratch.yaml").read_text())["kind"] == "none"
    assert " /scratch " not in (root / "etc/fstab").read_text()


def test_local_mode_sata_drives_become_a_raid5_data_cache(root: Path, tmp_path: Path) -> None:
    result, _ = run(work(), root, tmp_path / "state")
    assert result.outcome.ok, result
    storage = yaml.safe_load((root / "etc/rigbase/storage.yaml").read_text())
    assert storage["mode"] == "local" and storage["applied"] is False
    cache = storage["cache"]
    assert cache == plugin().cache_layout(SATA)
    assert cache["kind"] == "raid5" and cache["raid"]["members"] == ["/dev/sda1", "/dev/sdb1", "/dev/sdc1"]
    assert cache["size_bytes"] == 2 * 4 * 10**12
    fstab = (root / "etc/fstab").read_text().splitlines()
    assert "LABEL=rigbase-cache /data/cache ext4 defaults,noatime,nofail 0 2" in fstab
    assert (root / "data/cache").is_dir()


def test_local_mode_with_too_few_sata_drives_fails_before_changing_storage(
    root: Path, tmp_path: Path
) -> None:
    result, _ = run(work(rigbase_sata_drives=SATA[:2]), root, tmp_path / "state")
    assert not result.outcome.ok
    assert result.outcome.failed_task == "Compute the local data cache layout"
    assert "at least 3 free SATA drives" in (result.outcome.message or "")
    assert not (root / "etc/rigbase/storage.yaml").exists()


def test_central_mode_mounts_the_storage_nodes_cache_over_nfs4(root: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    w = work(rigbase_storage_mode="central", rigbase_sata_drives=[], rigbase_nfs_server="10.77.0.9")
    result, _ = run(w, root, state)
    assert result.outcome.ok, result
    fstab = (root / "etc/fstab").read_text().splitlines()
    assert "10.77.0.9:/scratch/cache /data/cache nfs4 defaults,_netdev,nofail,noatime 0 0" in fstab
    assert result.facts["storage"]["cache"]["kind"] == "nfs4"
    again, _ = run(w, root, state)
    assert again.outcome.ok and again.outcome.changed == 0
    # the storage node was replaced: the control plane sends its new address, fstab follows
    moved, _ = run(
        work(rigbase_storage_mode="central", rigbase_sata_drives=[], rigbase_nfs_server="s2"), root, state
    )
    assert moved.outcome.ok
    fstab = (root / "etc/fstab").read_text()
    assert "s2:/scratch/cache /data/cache nfs4" in fstab and "10.77.0.9" not in fstab


def test_storage_finalize_exports_the_region_cache(root: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    w = work(rigbase_service="storage", rigbase_nfs_clients=["10.77.0.0/24", "10.78.0.0/24"])
    first, events = run(w, root, state)
    assert first.outcome.ok, first
    exports = (root / "etc/exports.d/rigbase-cache.exports").read_text().splitlines()
    assert (
        "/scratch/cache 10.77.0.0/24(rw,sync,no_subtree_check,root_squash) "
        "10.78.0.0/24(rw,sync,no_subtree_check,root_squash)" in exports
    )
    assert finished(events)["Enable the NFS server"] is TaskStatus.SKIPPED
    assert first.facts["storage"]["export"]["path"] == "/scratch/cache"
    assert not (root / "data/cache").exists()  # a storage node has no data cache of its own
    second, _ = run(w, root, state)
    assert second.outcome.ok and second.outcome.changed == 0


def test_storage_without_client_networks_fails_before_exporting(root: Path, tmp_path: Path) -> None:
    result, _ = run(work(rigbase_service="storage", rigbase_nfs_clients=[]), root, tmp_path / "state")
    assert not result.outcome.ok
    assert result.outcome.failed_task == "Check the NFS clients of the region cache"
    assert not (root / "etc/exports.d/rigbase-cache.exports").exists()
    assert not (tmp_path / "state/finalize/saved/work.json").exists()  # only success is saved


def test_an_invalid_hostname_fails_with_that_task_and_changes_nothing(root: Path, tmp_path: Path) -> None:
    before = tree(root / "etc")
    result, events = run(work(rigbase_hostname="n1_lab!"), root, tmp_path / "state")
    assert not result.outcome.ok
    assert result.outcome.failed_task == "Check the hostname is a valid DNS name"
    assert '"n1_lab!" is not a valid hostname' in (result.outcome.message or "")
    assert [e.task for e in events if e.status is TaskStatus.FAILED] == [result.outcome.failed_task]
    assert tree(root / "etc") == before  # preflight runs before any change


def test_an_unwritable_path_fails_with_that_task_and_a_retry_converges(root: Path, tmp_path: Path) -> None:
    (root / "etc/rigbase").write_text("in the way\n")
    result, _ = run(work(), root, tmp_path / "state")
    assert not result.outcome.ok
    assert result.outcome.failed_task == "Create the rigbase configuration directory"
    (root / "etc/rigbase").unlink()  # the operator fixes the node, then `provision node retry`
    retry, _ = run(work(retry=1), root, tmp_path / "state")
    assert retry.outcome.ok, retry


def test_lab_mode_must_match_the_connection(root: Path, tmp_path: Path) -> None:
    # the control plane cannot talk a lab minion into treating its chroot as a real node
    result, _ = run(work(rigbase_lab=False), root, tmp_path / "state")
    assert result.outcome.ok  # the minion's rigbase_lab wins over the work's variables
    from minion.finalize.runner import extravars_for

    assert extravars_for(work(rigbase_lab=False), root)["rigbase_lab"] is True
    assert extravars_for(work(rigbase_lab=True), None)["rigbase_lab"] is False
