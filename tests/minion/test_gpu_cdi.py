"""`minion gpu cdi` against driver roots built here, compared with what NVIDIA's own toolkit expects
(github.com/NVIDIA/nvidia-container-toolkit, testdata/lookup/rootfs-1 and the expected spec of
cmd/nvidia-ctk/cdi/generate/generate_test.go, Apache-2.0), and a spec that real podman accepts.

The roots hold character devices made with mknod (null's and zero's numbers: harmless), libraries as
files (and one real ELF library, so that the root's ld.so cache is the one real `ldconfig -r` builds),
and the module's version where a loaded driver puts it (/sys/module/nvidia/version). No GPU here."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from minion.gpu import cdi
from minion.gpu.driver import NoDriver, discover
from minion.gpu.keeper import CdiKeeper
from tests.minion.test_jobs_podman import IMAGE, RUNTIME, image  # noqa: F401  (fixture)

VERSION = "999.88.77"
LIB = "/lib/x86_64-linux-gnu"

# What the toolkit's test expects for rootfs-1 with one GPU (driverRoot substituted), less its hooks:
# create-symlinks, enable-cuda-compat, update-ldcache, disable-device-node-modification and
# update-application-profile run nvidia-cdi-hook, which a rigbase node does not have, and
# NVIDIA_CTK_LIBCUDA_DIR is read by those hooks only.
TOOLKIT_EXPECTED = """
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
    - name: "0"
      containerEdits:
        deviceNodes:
            - path: /dev/nvidia0
              hostPath: {root}/dev/nvidia0
    - name: all
      containerEdits:
        deviceNodes:
            - path: /dev/nvidia0
              hostPath: {root}/dev/nvidia0
containerEdits:
    env:
        - NVIDIA_VISIBLE_DEVICES=void
    deviceNodes:
        - path: /dev/nvidiactl
          hostPath: {root}/dev/nvidiactl
    mounts:
        - hostPath: {root}/lib/x86_64-linux-gnu/libcuda.so.999.88.77
          containerPath: /lib/x86_64-linux-gnu/libcuda.so.999.88.77
          options: [ro, nosuid, nodev, rbind, rprivate]
        - hostPath: {root}/lib/x86_64-linux-gnu/vdpau/libvdpau_nvidia.so.999.88.77
          containerPath: /lib/x86_64-linux-gnu/vdpau/libvdpau_nvidia.so.999.88.77
          options: [ro, nosuid, nodev, rbind, rprivate]
"""


def needs_mknod() -> None:
    if os.geteuid() != 0:
        pytest.skip("device nodes need mknod: run the tests as root")


def char_device(path: Path, minor: int = 3) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, minor))


def _file(path: Path, text: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def rootfs_1(root: Path) -> Path:
    """The toolkit's testdata/lookup/rootfs-1, as far as a GPU's spec reads it."""
    char_device(root / "dev/nvidia0")
    char_device(root / "dev/nvidiactl")
    _file(root / f"lib/x86_64-linux-gnu/libcuda.so.{VERSION}")
    (root / "lib/x86_64-linux-gnu/libcuda.so.1").symlink_to(f"libcuda.so.{VERSION}")
    _file(root / f"lib/x86_64-linux-gnu/vdpau/libvdpau_nvidia.so.{VERSION}")
    _file(root / "etc/cufile.json")
    _file(root / "sys/module/nvidia/version", f"{VERSION}\n")
    return root


@pytest.fixture
def root(tmp_path: Path) -> Path:
    needs_mknod()
    return rootfs_1(tmp_path / "driver-root")


def test_the_spec_lists_what_the_toolkit_lists_with_links_for_its_hooks(root: Path) -> None:
    made = cdi.spec(discover(root))
    expected = yaml.safe_load(TOOLKIT_EXPECTED.format(root=root))
    assert made["devices"] == expected["devices"]
    assert made["containerEdits"]["env"] == expected["containerEdits"]["env"]
    assert made["containerEdits"]["deviceNodes"] == expected["containerEdits"]["deviceNodes"]
    mounts = made["containerEdits"]["mounts"]
    assert mounts[:2] == expected["containerEdits"]["mounts"]
    # in place of create-symlinks and update-ldcache: the same library at its soname and its dev name
    library = f"{root}{LIB}/libcuda.so.{VERSION}"
    assert [(m["containerPath"], m["hostPath"]) for m in mounts[2:]] == [
        (f"{LIB}/libcuda.so", library),
        (f"{LIB}/libcuda.so.1", library),
    ]
    assert cdi.render(made).startswith("---\ncdiVersion: 0.5.0\n")


def test_a_debian_driver_is_found_through_the_roots_ld_cache_and_its_alternatives(tmp_path: Path) -> None:
    """Debian installs the libraries under nvidia/current and links them through /etc/alternatives with
    absolute links: they are followed inside the root, and the real ld cache's soname is the alias."""
    if os.geteuid() != 0 or shutil.which("gcc") is None:
        pytest.skip("needs root (mknod) and gcc (a real ELF library for ldconfig)")
    root = tmp_path / "debian"
    char_device(root / "dev/nvidia0")
    char_device(root / "dev/nvidia1")
    for node in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"):
        char_device(root / "dev" / node)
    current = root / "usr/lib/x86_64-linux-gnu/nvidia/current"
    current.mkdir(parents=True)
    source = tmp_path / "nvml.c"
    source.write_text("int nvmlInit_v2(void) { return 0; }\n")
    for soname, lib in (("libnvidia-ml.so.1", "libnvidia-ml"), ("libcuda.so.1", "libcuda")):
        built = current / f"{lib}.so.{VERSION}"
        subprocess.run(
            ["gcc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(built), str(source)], check=True
        )
        (current / soname).symlink_to(built.name)
        alternative = f"/etc/alternatives/nvidia--{soname}-x86_64-linux-gnu"
        (root / alternative.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (root / alternative.lstrip("/")).symlink_to(f"/usr/lib/x86_64-linux-gnu/nvidia/current/{soname}")
        (root / "usr/lib/x86_64-linux-gnu" / soname).symlink_to(alternative)
    _file(root / "usr/bin/nvidia-smi", "#!/bin/sh\n")
    _file(root / f"lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin")
    _file(root / "sys/module/nvidia/version", f"{VERSION}\n")
    _file(root / "etc/ld.so.conf", "/usr/lib/x86_64-linux-gnu\n")
    subprocess.run(["ldconfig", "-r", str(root)], check=True, capture_output=True)

    driver = discover(root)
    assert [(g.index, g.minor) for g in driver.gpus] == [(0, 0), (1, 1)]
    assert driver.control_nodes == ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
    nvidia = "/usr/lib/x86_64-linux-gnu/nvidia/current"
    assert [lib.container for lib in driver.libraries] == [
        f"{nvidia}/libcuda.so.{VERSION}",
        f"{nvidia}/libnvidia-ml.so.{VERSION}",
    ]
    aliases = {a.container: a.host for a in driver.aliases}
    # the ld cache's soname, in the system search path, is the real file (no link left dangling)
    assert (
        aliases["/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"] == f"{root}{nvidia}/libnvidia-ml.so.{VERSION}"
    )
    assert aliases["/usr/lib/x86_64-linux-gnu/libcuda.so.1"] == f"{root}{nvidia}/libcuda.so.{VERSION}"
    made = cdi.spec(driver)
    names = [d["name"] for d in made["devices"]]
    assert names == ["0", "1", "all"]
    containers = {m["containerPath"] for m in made["containerEdits"]["mounts"]}
    assert {"/usr/bin/nvidia-smi", f"/lib/firmware/nvidia/{VERSION}"} <= containers
    assert all(Path(m["hostPath"]).exists() for m in made["containerEdits"]["mounts"])


def _minion(*args: str) -> subprocess.CompletedProcess[str]:
    launcher = Path(sys.executable).parent / "minion"  # the venv's, as the node's package installs it
    return subprocess.run([str(launcher), *args], capture_output=True, text=True, timeout=60)


def test_the_command_prints_the_spec_and_refuses_a_broken_driver_in_one_line(
    root: Path, tmp_path: Path
) -> None:
    printed = _minion("gpu", "cdi", "--host-root", str(root), "--json")
    assert printed.returncode == 0, printed.stderr
    assert json.loads(printed.stdout) == cdi.spec(discover(root))
    out = tmp_path / "out" / "nvidia.yaml"
    (tmp_path / "out").mkdir()
    written = _minion("gpu", "cdi", "--host-root", str(root), "--output", str(out))
    assert written.returncode == 0 and yaml.safe_load(out.read_text())["kind"] == "nvidia.com/gpu"

    empty = tmp_path / "empty"
    empty.mkdir()
    (root / "sys/module/nvidia/version").write_text("515.105.01\n")  # the module and the libraries disagree
    for broken, words in ((empty, "no NVIDIA kernel module"), (root, "no libcuda.so.515.105.01")):
        refused = _minion("gpu", "cdi", "--host-root", str(broken))
        assert refused.returncode == 1 and words in refused.stderr, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1 and refused.stdout == ""
    with pytest.raises(NoDriver, match="no /dev/nvidiaN"):
        (root / "sys/module/nvidia/version").write_text(f"{VERSION}\n")
        (root / "dev/nvidia0").unlink()
        discover(root)


def podman_run(document: dict[str, Any], device: str, check: str) -> subprocess.CompletedProcess[str]:
    """`podman run --device KIND=DEVICE IMAGE sh -c CHECK` with `document` as a spec podman reads."""
    spec = Path("/etc/cdi") / f"rigbase-gpu-cdi-test-{secrets.token_hex(3)}.yaml"
    spec.parent.mkdir(exist_ok=True)
    spec.write_text(cdi.render(document))
    podman: list[str] = ["podman", "--runtime", str(RUNTIME["oci_runtime"])]
    podman += ["--cgroup-manager", str(RUNTIME["cgroup_manager"])]
    limits: list[Any] = [arg for u in RUNTIME["ulimits"] for arg in ("--ulimit", u)]  # type: ignore[attr-defined]
    try:
        return subprocess.run(
            [
                *podman,
                "run",
                "--rm",
                *limits,
                "--device",
                f"{document['kind']}={device}",
                IMAGE,
                "sh",
                "-c",
                check,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        spec.unlink()


def scratch_kind() -> str:
    return f"gpu-cdi-{secrets.token_hex(3)}.rigbase.dev/gpu"


@pytest.mark.usefixtures("image")
def test_podman_runs_a_container_with_a_gpu_of_the_spec(root: Path) -> None:
    """podman reads the spec and gives the container the GPU's node, the control node and the driver's
    files. (A customer's job runs in a user namespace, where runc binds a device from the host path of
    the same name: on a node the root is / and the paths are the same; here the node's own container.)"""
    document = cdi.spec(discover(root), kind=scratch_kind())
    check = (
        "[ -c /dev/nvidia0 ] && [ -c /dev/nvidiactl ] && echo nodes; "
        f"[ -f {LIB}/libcuda.so.1 ] && [ -f {LIB}/vdpau/libvdpau_nvidia.so.{VERSION} ] && echo libraries; "
        'echo "visible=$NVIDIA_VISIBLE_DEVICES"'
    )
    ran = podman_run(document, "0", check)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["nodes", "libraries", "visible=void"]


def rootfs_drm(root: Path) -> Path:
    """rootfs-1 with the toolkit's testdata/lookup/rootfs-drm beside it: GPU 0 at 0000:07:00.0 has a DRM
    card and render node (and their by-path links); GPU 1 at 0000:08:00.0 has no DRM driver bound."""
    rootfs_1(root)
    char_device(root / "dev/nvidia1")
    char_device(root / "dev/dri/card0", minor=5)
    char_device(root / "dev/dri/renderD128", minor=7)
    (root / "dev/dri/by-path").mkdir()
    (root / "dev/dri/by-path/pci-0000:07:00.0-card").symlink_to("../card0")
    (root / "dev/dri/by-path/pci-0000:07:00.0-render").symlink_to("../renderD128")
    for bus, minor in (("0000:07:00.0", 0), ("0000:08:00.0", 1)):
        _file(root / "proc/driver/nvidia/gpus" / bus / "information", f"Model: X\nDevice Minor: {minor}\n")
    for name in ("card0", "renderD128", "controlD64"):  # the toolkit gives no control node
        (root / "sys/bus/pci/devices/0000:07:00.0/drm" / name).mkdir(parents=True)
    return root


def test_a_gpus_drm_nodes_are_in_its_device_with_their_by_path_names(tmp_path: Path) -> None:
    """The toolkit gives GPU 0 /dev/dri/card0 and renderD128 (drm.GetDeviceNodesByBusID) and makes the
    by-path links with create-symlinks; here the links are nodes of their own with the same numbers."""
    needs_mknod()
    root = rootfs_drm(tmp_path / "drm")
    driver = discover(root)
    assert [(g.index, g.pci_bus_id) for g in driver.gpus] == [(0, "0000:07:00.0"), (1, "0000:08:00.0")]
    made = {d["name"]: d["containerEdits"]["deviceNodes"] for d in cdi.spec(driver)["devices"]}
    by_path = "/dev/dri/by-path/pci-0000:07:00.0"
    assert made["0"] == [
        {"path": "/dev/nvidia0", "hostPath": f"{root}/dev/nvidia0"},  # the toolkit's, as its test expects
        {"path": "/dev/dri/card0", "hostPath": f"{root}/dev/dri/card0"},
        {"path": "/dev/dri/renderD128", "hostPath": f"{root}/dev/dri/renderD128"},
        {"path": f"{by_path}-card", "hostPath": f"{root}/dev/dri/card0"},  # in place of create-symlinks
        {"path": f"{by_path}-render", "hostPath": f"{root}/dev/dri/renderD128"},
    ]
    assert made["1"] == [{"path": "/dev/nvidia1", "hostPath": f"{root}/dev/nvidia1"}]
    assert made["all"] == made["0"] + made["1"]


@pytest.mark.usefixtures("image")
def test_podman_gives_the_drm_nodes_at_both_names(tmp_path: Path) -> None:
    needs_mknod()
    document = cdi.spec(discover(rootfs_drm(tmp_path / "drm")), kind=scratch_kind())
    by_path = "/dev/dri/by-path/pci-0000:07:00.0"
    check = (
        f"[ -c /dev/dri/card0 ] && [ -c /dev/dri/renderD128 ] && [ -c {by_path}-card ] && echo drm; "
        "[ -e /dev/nvidia1 ] || echo 'not GPU 1'"
    )
    ran = podman_run(document, "0", check)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == ["drm", "not GPU 1"]


def test_the_minion_keeps_the_spec_in_step_with_the_driver(root: Path, tmp_path: Path) -> None:
    """Written at start, again when the driver's version or GPUs change, removed when the driver goes;
    the operator's own toolkit spec is left to serve; an unwritable directory is a one-line note."""
    run_cdi, etc_cdi = tmp_path / "run-cdi", tmp_path / "etc-cdi"
    keeper = CdiKeeper(run_cdi, (etc_cdi, run_cdi), root=root)
    clock = iter(range(0, 10_000, 60))  # every refresh a minute after the last: never throttled

    def written() -> dict[str, Any]:
        loaded: dict[str, Any] = yaml.safe_load((run_cdi / cdi.SPEC_NAME).read_text())
        return loaded

    assert keeper.refresh(now=next(clock)) is None and [d["name"] for d in written()["devices"]] == [
        "0",
        "all",
    ]
    char_device(root / "dev/nvidia1")  # a second GPU appears
    keeper.refresh(now=next(clock))
    assert [d["name"] for d in written()["devices"]] == ["0", "1", "all"]
    (root / "sys/module/nvidia/version").write_text("515.105.01\n")  # a new module, the old libraries
    assert "no libcuda.so.515.105.01" in (keeper.refresh(now=next(clock)) or "")
    assert not (run_cdi / cdi.SPEC_NAME).exists(), "a spec for a driver that is not there is removed"
    (root / "sys/module/nvidia/version").write_text(f"{VERSION}\n")
    etc_cdi.mkdir()
    (etc_cdi / "nvidia.yaml").write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\n")
    assert keeper.refresh(now=next(clock)) is None and not (run_cdi / cdi.SPEC_NAME).exists()
    (etc_cdi / "nvidia.yaml").unlink()
    blocked = CdiKeeper(tmp_path / "file" / "cdi", (tmp_path / "file" / "cdi",), root=root)
    (tmp_path / "file").write_text("not a directory")
    assert "cannot write the CDI spec" in (blocked.refresh(now=0) or "")
