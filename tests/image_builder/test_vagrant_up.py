"""`vagrant up` of the top-level Vagrantfile with the libvirt provider boots the USB image a build wrote:
UEFI firmware, the emulated TPM 2.0 libvirt starts (swtpm), NVMe drives, and the installer's prompt on the
serial console (docs/vagrant.md).

It runs with no network at all (`RIGBASE_NETWORK_MODE=off`: no bridge, no DHCP on the host) under TCG
(`RIGBASE_ACCEL=qemu`: /dev/kvm on this machine kind hangs a stock kernel), so it stops at the installer's
question; the join over a libvirt network is the operator's walk-through in docs/vagrant.md, and the
whole node life (install, join, finalize, reset) is tests/image_builder/test_node_life_vm.py.

libvirtd is started for the test when none runs (a bare CI machine: package scripts may not start
daemons there) and stopped afterwards; the image, the drives and a transient storage pool live in a
directory libvirt's QEMU user can read, removed at the end."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.image_builder.conftest import Built

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
LIBVIRT_SOCK = Path("/run/libvirt/libvirt-sock")
IMAGES = Path("/var/lib/libvirt/images")


def _virsh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["virsh", "-c", "qemu:///system", *args], capture_output=True, text=True, timeout=60, check=check
    )


@pytest.fixture
def libvirtd() -> Iterator[None]:
    for tool in ("vagrant", "virsh", "libvirtd", "virtlogd"):
        if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
            pytest.fail(
                f"{tool} is missing: scripts/install-deps.sh installs vagrant, vagrant-libvirt, libvirt"
            )
    started: list[str] = []
    if _virsh("version", check=False).returncode != 0:
        for daemon in ("virtlogd", "libvirtd"):
            pid_file = Path(f"/run/{daemon}.pid")
            subprocess.run([f"/usr/sbin/{daemon}", "-d"], check=True, timeout=30)
            started.append(daemon)
            deadline = time.monotonic() + 20
            while not pid_file.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
        deadline = time.monotonic() + 20
        while _virsh("version", check=False).returncode != 0:
            assert time.monotonic() < deadline, "libvirtd started but does not answer on qemu:///system"
            time.sleep(0.2)
    yield
    for daemon in reversed(started):
        pid_file = Path(f"/run/{daemon}.pid")
        if pid_file.exists():
            subprocess.run(["kill", pid_file.read_text().strip()], check=False)


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A directory libvirt's QEMU (user libvirt-qemu) can traverse and read: pytest's are 0700."""
    d = IMAGES / f"rigbase-test-{uuid.uuid4().hex[:8]}"
    d.mkdir(parents=True, mode=0o755)
    os.chmod(d, 0o777)  # the drives vagrant creates are QEMU's to write
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_vagrant_up_boots_the_usb_image_to_the_installer(
    built_image: Built, libvirtd: None, workdir: Path
) -> None:
    usb = workdir / "rigbase-usb.img"
    subprocess.run(["cp", "--sparse=always", str(built_image.out / "rigbase-usb.img"), str(usb)], check=True)
    os.chmod(usb, 0o644)
    console = workdir / "console"
    console.mkdir(mode=0o777)
    pool = f"rigbase-test-{workdir.name[-8:]}"
    prefix = f"{pool}_"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RIGBASE_", "VAGRANT_"))} | {
        "RIGBASE_IMAGE": str(usb),
        "RIGBASE_DISK_DIR": str(workdir / "disks"),
        "RIGBASE_CONSOLE_LOG": str(console),
        "RIGBASE_NETWORK_MODE": "off",
        "RIGBASE_ACCEL": "qemu",
        "RIGBASE_NODE_MEMORY": "1536",
        "RIGBASE_NODE_CPUS": "1",
        "RIGBASE_LIBVIRT_POOL": pool,
        "RIGBASE_DOMAIN_PREFIX": prefix,
        "VAGRANT_DOTFILE_PATH": str(workdir / "dot-vagrant"),
        "VAGRANT_HOME": str(workdir / "vagrant.d"),
        "VAGRANT_DEFAULT_PROVIDER": "libvirt",
    }
    _virsh("pool-create-as", pool, "dir", "--target", str(workdir))

    def vagrant(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["vagrant", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
        )

    try:
        up = vagrant("up", "--provider=libvirt")
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        domain = f"{prefix}node1"
        xml = _virsh("dumpxml", domain).stdout
        assert "<tpm model='tpm-crb'>" in xml and "emulator" in xml, xml
        log = console / "node1.log"
        deadline = time.monotonic() + 900
        text = ""
        while "to ERASE them and install rigbase" not in text:
            assert time.monotonic() < deadline, (
                f"no installer prompt on the console; last output:\n{text[-3000:]}"
            )
            assert _virsh("domstate", domain).stdout.strip() == "running", text[-3000:]
            time.sleep(5)
            text = log.read_text(errors="replace") if log.exists() else ""
        # the firmware booted the image from the USB drive, and the installer found the blank NVMe drives
        assert "USB" in text and "/dev/nvme0n1" in text, text[-3000:]
        # drives are sparse files: what the guest did not write takes no space
        drives = sorted((workdir / "disks" / "node1").glob("nvme*.img"))
        assert len(drives) == 3 and drives[1].stat().st_size == 600 * 1024**3
        assert sum(d.stat().st_blocks for d in drives) * 512 < 64 * 1024**2
    finally:
        down = vagrant("destroy", "-f")
        _virsh("pool-destroy", pool, check=False)
    assert down.returncode == 0, down.stdout + down.stderr
    assert prefix not in _virsh("list", "--all", "--name").stdout
