"""The pure parts of finalize: the scratch layout rule, the drive selection from the inventory, the
extravars and inventory a run is given, and ansible-runner event mapping. The playbooks themselves
run for real in test_finalize.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from contracts.errors import InvalidInput
from provisioner.adapters import ansible as finalize
from provisioner.adapters.ansible import (
    ChrootTarget,
    FinalizeRequest,
    SshTarget,
    TaskStatus,
    extravars_for,
    inventory_for,
    scratch_drives,
    to_event,
)

PLUGIN = Path(finalize.PLAYBOOK_DIR) / "filter_plugins" / "rigbase_scratch.py"
_spec = importlib.util.spec_from_file_location("rigbase_scratch", PLUGIN)
assert _spec and _spec.loader
scratch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scratch)

TB = 10**12


def test_no_drive_means_no_scratch_volume() -> None:
    layout = scratch.scratch_layout([])
    assert layout["kind"] == "none"
    assert layout["device"] is None and layout["fstab"] is None and layout["raid"] is None


def test_one_drive_is_formatted_directly() -> None:
    layout = scratch.scratch_layout([{"path": "/dev/nvme1n1", "size_bytes": 2 * TB}])
    assert layout["kind"] == "single"
    assert layout["device"] == "/dev/nvme1n1p1"
    assert layout["raid"] is None
    assert layout["fstab"] == "LABEL=rigbase-scratch /scratch ext4 defaults,noatime,nofail 0 2"
    assert layout["size_bytes"] == 2 * TB


def test_several_drives_are_striped_in_a_stable_order() -> None:
    layout = scratch.scratch_layout(["/dev/nvme2n1", "/dev/sdb", "/dev/nvme1n1"], mountpoint="/data")
    assert layout["kind"] == "raid0"
    assert layout["drives"] == ["/dev/nvme1n1", "/dev/nvme2n1", "/dev/sdb"]
    # a name ending in a digit gets 'p' before the partition number, the kernel's rule
    assert layout["raid"]["members"] == ["/dev/nvme1n1p1", "/dev/nvme2n1p1", "/dev/sdb1"]
    assert layout["device"] == "/dev/md/rigbase-scratch"
    assert layout["fstab"].startswith("LABEL=rigbase-scratch /data ext4 ")


def test_drives_in_use_on_a_real_node_are_left_out() -> None:
    drives = [{"path": f"/dev/nvme{i}n1", "size_bytes": TB} for i in range(3)]
    layout = scratch.scratch_layout(drives, exclude=["/dev/nvme0n1"])
    assert layout["excluded"] == ["/dev/nvme0n1"]
    assert layout["drives"] == ["/dev/nvme1n1", "/dev/nvme2n1"] and layout["size_bytes"] == 2 * TB
    assert scratch.scratch_layout(drives[:1], exclude=["/dev/nvme0n1"])["kind"] == "none"


def test_a_path_outside_dev_is_refused() -> None:
    with pytest.raises(ValueError, match="not a block device path"):
        scratch.scratch_layout(["/etc/passwd"])


def test_the_system_drive_never_joins_scratch() -> None:
    drives = scratch_drives(
        [
            {"path": "/dev/nvme0n1", "size_bytes": TB, "system": True},
            {"name": "nvme2n1", "size_bytes": 2 * TB},
            "/dev/nvme1n1",
            {"name": "sda", "kind": "sata", "size_bytes": 4 * TB},  # the minion's inventory, as it is
        ]
    )
    assert drives == [
        {"path": "/dev/nvme1n1", "size_bytes": 0},
        {"path": "/dev/nvme2n1", "size_bytes": 2 * TB},
    ]
    with pytest.raises(InvalidInput, match="no path or name"):
        scratch_drives([{"size_bytes": TB}])


def test_extravars_say_lab_or_not_explicitly() -> None:
    request = FinalizeRequest(
        "n1", "n1.lab", "compute", "lab", "https://cp:8470", extra_vars={"rigbase_scratch_mount": "/data"}
    )
    assert extravars_for(request, lab=True)["rigbase_lab"] is True
    assert extravars_for(request, lab=False)["rigbase_lab"] is False
    assert extravars_for(request, lab=False)["rigbase_scratch_mount"] == "/data"


def test_inventory_for_each_target(tmp_path: Path) -> None:
    chroot = inventory_for("n1", ChrootTarget(tmp_path), tmp_path)["all"]["hosts"]["n1"]
    assert chroot["ansible_connection"] == "community.general.chroot"
    assert chroot["ansible_host"] == str(tmp_path.resolve())
    ssh = inventory_for("n1", SshTarget("10.0.0.5", tmp_path / "key", user="admin"), tmp_path)["all"][
        "hosts"
    ]["n1"]
    assert ssh["ansible_host"] == "10.0.0.5" and ssh["ansible_become"] is True
    assert "StrictHostKeyChecking=accept-new" in ssh["ansible_ssh_common_args"]


def test_unknown_service_and_bad_targets_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="not a node service"):
        finalize.run_finalize(FinalizeRequest("n1", "n1", "gpu", "lab", "https://cp"), ChrootTarget(tmp_path))
    with pytest.raises(InvalidInput, match="not a lab root"):
        finalize.run_finalize(
            FinalizeRequest("n1", "n1", "compute", "lab", "https://cp"), ChrootTarget(tmp_path)
        )
    with pytest.raises(InvalidInput, match="SSH key"):
        finalize.run_finalize(
            FinalizeRequest("n1", "n1", "compute", "lab", "https://cp"),
            SshTarget("10.0.0.5", tmp_path / "missing"),
        )


def test_runner_events_map_to_history_statuses() -> None:
    def raw(event: str, **data: object) -> dict[str, object]:
        return {"event": event, "event_data": {"task": "T", **data}}

    assert to_event(raw("playbook_on_task_start"), "n1").status is TaskStatus.STARTED
    assert to_event(raw("playbook_on_task_start"), "n1").host == "n1"
    assert to_event(raw("runner_on_ok", host="n1", res={"changed": False}), "n1").status is TaskStatus.OK
    assert to_event(raw("runner_on_ok", host="n1", res={"changed": True}), "n1").status is TaskStatus.CHANGED
    failed = to_event(raw("runner_on_failed", host="n1", res={"msg": "no\n space"}), "n1")
    assert failed.status is TaskStatus.FAILED and failed.message == "no space"
    assert to_event(raw("runner_on_failed", ignore_errors=True, res={}), "n1").status is TaskStatus.IGNORED
    assert to_event(raw("runner_on_unreachable", res={"msg": "ssh: timeout"}), "n1").message == "ssh: timeout"
    assert to_event(raw("playbook_on_stats"), "n1") is None
