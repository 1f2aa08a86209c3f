"""A Jetson's GPU in CSV mode (minion/gpu/csv_mode.py): L4T's host-files-for-container.d on a root built
here as the toolkit's testdata/lookup/rootfs-orin is (its /dev/nvidia0, libcuda.so.1.1 and
libnvidia-ml.so.1, among CSV lines for files the board does not have), compared with the spec
pkg/nvcdi/lib-csv_test.go expects for it ("single orin CSV device", github.com/NVIDIA/nvidia-container-
toolkit, Apache-2.0), kept by the minion's CdiKeeper, and given to a real podman container by the name
the device agent asks for (`nvidia.com/gpu=all`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from minion.devices.agent import ACCELERATOR
from minion.gpu import cdi, csv_mode
from minion.gpu.driver import NoDriver
from minion.gpu.keeper import CdiKeeper
from tests.minion.test_gpu_cdi import char_device, needs_mknod, podman_run, scratch_kind
from tests.minion.test_jobs_podman import image  # noqa: F401  (fixture)

NV = "/usr/lib/aarch64-linux-gnu/nvidia"
OPTIONS = ["ro", "nosuid", "nodev", "rbind", "rprivate"]
DEVICES_CSV = """\
dev, /dev/dri/card*
dev, /dev/dri/renderD*
dir, /dev/dri/by-path
dev, /dev/nvgpu/igpu0/ctrl
dev, /dev/nvidia0
dev, /dev/nvhost-ctrl-gpu
dev, /dev/nvmap
"""
DRIVERS_CSV = f"""\
# L4T lists every board's files; each board has some of them
lib, /usr/lib/aarch64-linux-gnu/libv4l2.so.0
lib, {NV}/libcuda.so.1.1
lib, {NV}/libnvidia-ml.so.1
lib, {NV}/libnvrm_gpu.so
sym, /usr/lib/aarch64-linux-gnu/libcuda.so
sym, /etc/vulkan/icd.d/nvidia_icd.json
"""


def rootfs_orin(root: Path, *, nvgpu: bool = False) -> Path:
    """The toolkit's rootfs-orin; `nvgpu`: also an Orin's nvgpu control node (a nested /dev path)."""
    char_device(root / "dev/nvidia0")
    if nvgpu:
        char_device(root / "dev/nvgpu/igpu0/ctrl", minor=5)
    for name in ("libcuda.so.1.1", "libnvidia-ml.so.1"):
        (root / NV.lstrip("/")).mkdir(parents=True, exist_ok=True)
        (root / NV.lstrip("/") / name).write_text("")
    csvs = root / csv_mode.CSV_DIR
    csvs.mkdir(parents=True)
    (csvs / "devices.csv").write_text(DEVICES_CSV)
    (csvs / "drivers.csv").write_text(DRIVERS_CSV)
    return root


@pytest.fixture
def orin(tmp_path: Path) -> Path:
    needs_mknod()
    return rootfs_orin(tmp_path / "orin")


def test_the_csv_spec_lists_what_the_toolkit_lists_with_mounts_and_env_for_its_hooks(orin: Path) -> None:
    made, what = cdi.node_spec(orin)
    assert what == "the L4T GPU (2 CSV file(s))"
    nodes = [{"path": "/dev/nvidia0", "hostPath": f"{orin}/dev/nvidia0"}]
    assert made["devices"] == [
        {"name": "0", "containerEdits": {"deviceNodes": nodes}},  # the toolkit's, as its test expects
        {"name": "all", "containerEdits": {"deviceNodes": nodes}},  # what a device's container asks for
    ]
    mounts = [(m["containerPath"], m["hostPath"]) for m in made["containerEdits"]["mounts"]]
    toolkit = [  # the toolkit's two mounts, in its order
        (f"{NV}/libcuda.so.1.1", f"{orin}{NV}/libcuda.so.1.1"),
        (f"{NV}/libnvidia-ml.so.1", f"{orin}{NV}/libnvidia-ml.so.1"),
    ]
    assert [m for m in mounts if m in toolkit] == toolkit
    # in place of create-symlinks (libcuda.so.1::NV/libcuda.so) and update-ldcache (its soname link):
    assert set(mounts) - set(toolkit) == {
        (f"{NV}/libcuda.so.1", f"{orin}{NV}/libcuda.so.1.1"),
        (f"{NV}/libcuda.so", f"{orin}{NV}/libcuda.so.1.1"),
    }
    assert all(m["options"] == OPTIONS for m in made["containerEdits"]["mounts"])
    # update-ldcache --folder NV: the dynamic linker searches the folder through the environment
    assert made["containerEdits"]["env"] == ["NVIDIA_VISIBLE_DEVICES=void", f"LD_LIBRARY_PATH={NV}"]


def test_links_are_mounted_at_their_own_paths_and_bad_lines_are_refused_in_one_line(orin: Path) -> None:
    (orin / "usr/lib/aarch64-linux-gnu/libcuda.so").symlink_to(f"{NV}/libcuda.so.1.1")  # absolute: the root's
    (orin / "dev/dri/by-path").mkdir(parents=True)
    install = csv_mode.discover(orin)
    at = {m.container: m.host for m in install.mounts}
    assert at["/usr/lib/aarch64-linux-gnu/libcuda.so"] == f"{orin}{NV}/libcuda.so.1.1"
    assert at["/dev/dri/by-path"] == f"{orin}/dev/dri/by-path"
    assert "/etc/vulkan/icd.d/nvidia_icd.json" not in at  # not on this board: skipped

    (orin / csv_mode.CSV_DIR / "extra.csv").write_text("lib, /ok\nfile /usr/lib/x\n")
    with pytest.raises(NoDriver, match=r"extra.csv:2: 'file /usr/lib/x' is not `TYPE, /PATH`"):
        csv_mode.discover(orin)
    (orin / csv_mode.CSV_DIR / "extra.csv").unlink()
    (orin / "dev/nvidia0").unlink()
    with pytest.raises(NoDriver, match="name no device node"):
        csv_mode.discover(orin)


def test_the_keeper_writes_the_csv_spec_on_a_jetson_and_again_when_l4t_changes(
    orin: Path, tmp_path: Path
) -> None:
    run_cdi = tmp_path / "run-cdi"
    keeper = CdiKeeper(run_cdi, (run_cdi,), root=orin)
    assert keeper.refresh(now=0) is None
    written = yaml.safe_load((run_cdi / cdi.SPEC_NAME).read_text())
    assert [d["name"] for d in written["devices"]] == ["0", "all"]
    char_device(orin / "dev/nvmap", minor=7)
    csv = orin / csv_mode.CSV_DIR / "devices.csv"
    csv.write_text(csv.read_text())  # an L4T update rewrites its CSV files
    os.utime(csv, ns=(csv.stat().st_atime_ns, csv.stat().st_mtime_ns + 1_000_000))
    assert keeper.refresh(now=60) is None
    again = yaml.safe_load((run_cdi / cdi.SPEC_NAME).read_text())
    assert [n["path"] for n in again["devices"][1]["containerEdits"]["deviceNodes"]] == [
        "/dev/nvidia0",
        "/dev/nvmap",
    ]


@pytest.mark.usefixtures("image")
def test_podman_gives_a_device_container_the_jetson_gpu_by_the_agents_name(tmp_path: Path) -> None:
    needs_mknod()
    root = rootfs_orin(tmp_path / "orin", nvgpu=True)
    document, _ = cdi.node_spec(root)
    document["kind"] = scratch_kind()
    assert ACCELERATOR.endswith("=all")
    check = (
        "[ -c /dev/nvidia0 ] && [ -c /dev/nvgpu/igpu0/ctrl ] && echo nodes; "
        f"[ -f {NV}/libcuda.so.1 ] && [ -f {NV}/libnvidia-ml.so.1 ] && echo libraries; "
        'echo "path=$LD_LIBRARY_PATH"'
    )
    ran = podman_run(document, ACCELERATOR.split("=", 1)[1], check)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["nodes", "libraries", f"path={NV}"]
