"""The pure parts of on-node finalize: the scratch and data cache layout rules (the playbooks' filter),
the inventory and variables a run is given, ansible-runner event mapping, the bundle's unpacking rules
and where the collections are found. The plays themselves run for real in test_finalize.py."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from contracts.finalize import TaskStatus
from minion.finalize.bundle import BundleProblem, unpack
from minion.finalize.events import to_event
from minion.finalize.runner import (
    BOOT_SKIP_TAGS,
    CollectionsMissing,
    extravars_for,
    find_collections,
    inventory_for,
)
from tests.minion.finalize_helpers import SATA, plugin, work

scratch = plugin()
TB = 10**12


def test_no_drive_means_no_scratch_volume() -> None:
    layout = scratch.scratch_layout([])
    assert layout["kind"] == "none"
    assert layout["device"] is None and layout["fstab"] is None and layout["raid"] is None


def test_one_drive_is_formatted_directly() -> None:
    layout = scratch.scratch_layout([{"path": "/dev/nvme1n1", "size_bytes": 2 * TB}])
    assert layout["kind"] == "single" and layout["device"] == "/dev/nvme1n1p1" and layout["raid"] is None
    assert layout["fstab"] == "LABEL=rigbase-scratch /scratch ext4 defaults,noatime,nofail 0 2"


def test_several_drives_are_striped_in_a_stable_order() -> None:
    layout = scratch.scratch_layout(["/dev/nvme2n1", "/dev/sdb", "/dev/nvme1n1"], mountpoint="/data")
    assert layout["kind"] == "raid0"
    assert layout["raid"]["members"] == ["/dev/nvme1n1p1", "/dev/nvme2n1p1", "/dev/sdb1"]
    assert layout["fstab"].startswith("LABEL=rigbase-scratch /data ext4 ")


def test_drives_in_use_on_a_real_node_are_left_out() -> None:
    drives = [{"path": f"/dev/nvme{i}n1", "size_bytes": TB} for i in range(3)]
    layout = scratch.scratch_layout(drives, exclude=["/dev/nvme0n1"])
    assert layout["drives"] == ["/dev/nvme1n1", "/dev/nvme2n1"] and layout["size_bytes"] == 2 * TB


def test_the_data_cache_is_raid5_over_at_least_three_sata_drives() -> None:
    layout = scratch.cache_layout(SATA + [{"path": "/dev/sdd", "size_bytes": 8 * TB}])
    assert layout["kind"] == "raid5" and layout["raid"]["level"] == 5
    assert layout["size_bytes"] == 3 * 4 * TB  # n-1 drives of the smallest
    assert layout["fstab"] == "LABEL=rigbase-cache /data/cache ext4 defaults,noatime,nofail 0 2"
    with pytest.raises(ValueError, match="at least 3 free SATA drives"):
        scratch.cache_layout(SATA, exclude=["/dev/sda"])
    with pytest.raises(ValueError, match="not a block device path"):
        scratch.cache_layout(["/etc/passwd", "/dev/sdb", "/dev/sdc"])


def test_inventory_is_local_on_a_node_and_chroot_in_the_lab(tmp_path: Path) -> None:
    local = inventory_for(None)["all"]["hosts"]["node"]
    assert local["ansible_connection"] == "local"
    chroot = inventory_for(tmp_path)["all"]["hosts"]["node"]
    assert chroot["ansible_connection"] == "community.general.chroot"
    assert chroot["ansible_host"] == str(tmp_path.resolve())
    assert extravars_for(work(), tmp_path)["rigbase_lab"] is True
    assert extravars_for(work(rigbase_lab=True), None)["rigbase_lab"] is False


def test_collections_are_found_or_named_where_they_were_looked_for(tmp_path: Path) -> None:
    with pytest.raises(CollectionsMissing, match=f"missing from {tmp_path}"):
        find_collections(tmp_path)
    plugin_file = tmp_path / "c/ansible_collections/community/general/plugins/connection/chroot.py"
    plugin_file.parent.mkdir(parents=True)
    plugin_file.touch()
    assert find_collections(None, search=[tmp_path / "none", tmp_path / "c"]) == tmp_path / "c"


def test_runner_events_map_to_history_statuses() -> None:
    def raw(event: str, **data: object) -> dict[str, object]:
        return {"event": event, "event_data": {"task": "T", **data}}

    assert to_event(raw("playbook_on_task_start")).status is TaskStatus.STARTED  # type: ignore[union-attr]
    assert to_event(raw("runner_on_ok", res={"changed": True})).status is TaskStatus.CHANGED  # type: ignore[union-attr]
    failed = to_event(raw("runner_on_failed", res={"msg": "no\n space"}))
    assert failed is not None and failed.status is TaskStatus.FAILED and failed.message == "no space"
    assert to_event(raw("runner_on_failed", ignore_errors=True, res={})).status is TaskStatus.IGNORED  # type: ignore[union-attr]
    assert to_event(raw("playbook_on_stats")) is None


def _tgz(*members: tarfile.TarInfo) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for m in members:
            tar.addfile(m, io.BytesIO(b"x" * m.size) if m.isfile() else None)
    return raw.getvalue()


@pytest.mark.parametrize("name", ["/etc/passwd", "../escape.yml", "roles/../../x"])
def test_a_bundle_member_outside_its_directory_is_refused(tmp_path: Path, name: str) -> None:
    member = tarfile.TarInfo(name)
    member.size = 1
    with pytest.raises(BundleProblem, match="not a plain relative path"):
        unpack(_tgz(member), tmp_path / "b")
    assert not (tmp_path / "b").exists() and not (tmp_path / "b.tmp").exists()


def test_a_bundle_link_is_refused(tmp_path: Path) -> None:
    link = tarfile.TarInfo("x.yml")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/shadow"
    with pytest.raises(BundleProblem, match="not a plain relative path"):
        unpack(_tgz(link), tmp_path / "b")


@pytest.mark.parametrize("has_data_filter", [True, False])
def test_a_bundle_unpacks_with_and_without_tarfiles_data_filter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, has_data_filter: bool
) -> None:
    """Debian 12's python3 (3.11.2, the node's) has no tarfile.data_filter (3.11.4+): unpack must work
    on both, and the member checks hold either way."""
    if not has_data_filter:
        monkeypatch.delattr(tarfile, "data_filter")
    play, roles = tarfile.TarInfo("site.yml"), tarfile.TarInfo("roles")
    play.size, roles.type = 3, tarfile.DIRTYPE
    out = unpack(_tgz(roles, play), tmp_path / "b")
    assert (out / "site.yml").read_bytes() == b"xxx" and (out / "roles").is_dir()
    escape = tarfile.TarInfo("../x.yml")
    escape.size = 1
    with pytest.raises(BundleProblem, match="not a plain relative path"):
        unpack(_tgz(escape), tmp_path / "c")


def test_live_state_reads_mounts_and_exports_the_play_recorded(tmp_path: Path) -> None:
    """What the minion reports after a reboot: each recorded mount point and its device, the exports."""
    from minion.finalize.live import live_state

    mounts = tmp_path / "mounts"
    mounts.write_text(
        "/dev/vda2 / ext4 rw 0 0\n/dev/md127 /scratch ext4 rw,noatime 0 0\nnfsd /proc/fs/nfsd nfsd rw 0 0\n"
    )
    etab = tmp_path / "etab"
    etab.write_text("/scratch/cache\t10.0.0.0/8(rw,sync)\n")
    facts = {"scratch": {"mountpoint": "/scratch", "device": "/dev/md/rigbase-scratch"}, "other": "x"}
    assert live_state(facts, mounts, etab) == {
        "mounts": {"/scratch": "/dev/md127"},
        "exports": ["/scratch/cache"],
    }
    assert live_state({"storage": {"cache": {"mountpoint": "/data/cache"}}}, mounts, tmp_path / "none") == {
        "mounts": {"/data/cache": None},
        "exports": [],
    }


def _tasks(tasks: list[dict[str, object]]) -> list[dict[str, object]]:
    """Every task of a role's task list, those inside blocks included."""
    out: list[dict[str, object]] = []
    for task in tasks:
        inner = task.get("block")
        out.extend(_tasks(inner) if isinstance(inner, list) else [task])
    return out


def test_the_boot_skips_exactly_what_lives_on_the_drives() -> None:
    """apply-saved leaves out BOOT_SKIP_TAGS at boot: the tasks that partition, assemble and format drives
    (their work survives a reboot) and the checks in front of them, never what the reboot loses (/etc,
    the mounts, the running hostname and services)."""
    import yaml

    roles = Path(__file__).resolve().parents[2] / "playbooks" / "roles"
    tagged = {
        str(task["name"])
        for main in roles.glob("*/tasks/main.yml")
        for task in _tasks(yaml.safe_load(main.read_text()))
        if BOOT_SKIP_TAGS in (task.get("tags") or [])  # type: ignore[operator]
    }
    assert tagged == {
        "Find the scratch drives",
        "Check the scratch drives are block devices",
        "Partition the scratch drives",
        "Assemble the scratch RAID0",
        "Make the scratch filesystem",
        "Find the data cache drives",
        "Check the data cache drives are block devices",
        "Partition the data cache drives",
        "Assemble the data cache RAID5",
        "Make the data cache filesystem",
    }
