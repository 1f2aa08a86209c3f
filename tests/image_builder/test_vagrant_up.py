"""`vagrant up` of the top-level Vagrantfile with the libvirt provider boots the USB image a build wrote:
UEFI firmware, the emulated TPM 2.0 libvirt starts (swtpm), NVMe drives, and the installer's prompt on the
serial console (docs/vagrant.md).

It runs with no network at all (`RIGBASE_NETWORK_MODE=off`: no bridge, no DHCP on the host) under TCG
(`RIGBASE_ACCEL=qemu`: /dev/kvm on this machine kind hangs a stock kernel), so it stops at the installer's
question; the install and the join are test_vagrant_join.py (`make test-vagrant`), and the whole node
life (install, join, finalize, reset) is tests/image_builder/test_node_life_vm.py.

libvirtd is started for the test when none runs (tests/image_builder/libvirt_host.py: in a network
namespace of its own) and stopped afterwards; the image, the drives and a transient storage pool live in a
directory libvirt's QEMU user can read, removed at the end."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.image_builder.conftest import Built
from tests.image_builder.libvirt_host import Libvirtd, libvirt_dir, libvirtd, vagrant_env, virsh

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def daemon() -> Iterator[Libvirtd]:
    with libvirtd() as d:
        yield d


@pytest.fixture
def workdir() -> Iterator[Path]:
    with libvirt_dir("rigbase-test") as d:
        yield d


def test_vagrant_up_boots_the_usb_image_to_the_installer(
    built_image: Built, daemon: Libvirtd, workdir: Path
) -> None:
    usb = workdir / "rigbase-usb.img"
    subprocess.run(["cp", "--sparse=always", str(built_image.out / "rigbase-usb.img"), str(usb)], check=True)
    os.chmod(usb, 0o644)
    console = workdir / "console"
    console.mkdir(mode=0o777)
    pool = f"rigbase-test-{workdir.name[-8:]}"
    prefix = f"{pool}_"
    env = vagrant_env(usb, workdir, pool, "off", RIGBASE_CONSOLE_LOG=str(console))
    virsh("pool-create-as", pool, "dir", "--target", str(workdir))

    def vagrant(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["vagrant", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
        )

    try:
        up = vagrant("up", "--provider=libvirt")
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        domain = f"{prefix}node1"
        xml = virsh("dumpxml", domain).stdout
        assert "<tpm model='tpm-crb'>" in xml and "emulator" in xml, xml
        log = console / "node1.log"
        deadline = time.monotonic() + 900
        text = ""
        while "to ERASE them and install rigbase" not in text:
            assert time.monotonic() < deadline, (
                f"no installer prompt on the console; last output:\n{text[-3000:]}"
            )
            assert virsh("domstate", domain).stdout.strip() == "running", text[-3000:]
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
        virsh("pool-destroy", pool, check=False)
    assert down.returncode == 0, down.stdout + down.stderr
    assert prefix not in virsh("list", "--all", "--name").stdout
