"""First-boot installer, run on the node by rigbase-installer.service (stdlib only: it runs on the image).

Booted from the USB drive with no matching rigbase OS on the NVMe drives, it asks on every console to type
'yes' (anything else aborts and writes nothing), lays out the NVMe drives, copies the verity-protected root
and its hash tree from the USB drive, and reboots. The UKI and the region bundle stay on the USB drive, so
the node keeps booting from it; the NVMe drives get a small ESP whose only boot application prints that the
USB drive is missing.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

OS_ROOT, OS_VERITY, OS_STATE, OS_ESP = (
    "rigbase-os-root",
    "rigbase-os-verity",
    "rigbase-state",
    "rigbase-nvme-esp",
)
USB_ROOT, USB_VERITY = "rigbase-usb-root", "rigbase-usb-verity"
DATA = "rigbase-data"
BOOT_SOURCE = Path("/etc/rigbase/boot-source")
MISSING_USB_ESP = Path("/usr/share/rigbase/nvme-esp.img")
CONSOLES = ("/dev/ttyS0", "/dev/tty1")

ESP_TYPE = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B"
ROOT_TYPE = "4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709"
VERITY_TYPE = "2C7357ED-EBD2-46D9-AEC1-23D437EC2BF5"
LINUX_TYPE = "0FC63DAF-8483-4772-8E79-3D69D8477DE4"
MiB = 2**20


class Situation(Enum):
    """What the installer finds, and what it does about it (see ACTIONS)."""

    BOOTED_FROM_NVME = "booted-from-nvme"  # the installed OS verified: nothing to do
    NO_NVME = "no-nvme"  # nothing to install to
    BLANK = "blank"  # no rigbase OS on the NVMe drives: ask, then install
    OTHER_BUILD = "other-build"  # a rigbase OS that does not match this USB drive: ask, then replace


ACTIONS: dict[Situation, str] = {
    Situation.BOOTED_FROM_NVME: "skip",
    Situation.NO_NVME: "refuse",
    Situation.BLANK: "ask",
    Situation.OTHER_BUILD: "ask",
}

PROMPTS: dict[Situation, str] = {
    Situation.BLANK: "No rigbase OS on the NVMe drives ({drives}).\n"
    "Type 'yes' to ERASE them and install rigbase: ",
    Situation.OTHER_BUILD: "The NVMe drives hold a different rigbase build ({drives}).\n"
    "Type 'yes' to ERASE them and install this one: ",
}


@dataclass(frozen=True)
class BlockPart:
    dev: str  # e.g. /dev/nvme0n1p1
    disk: str  # e.g. nvme0n1
    name: str  # GPT partition name


def partitions(sys_block: Path = Path("/sys/class/block")) -> list[BlockPart]:
    """GPT partitions with names, from the kernel's uevent files (no udev needed)."""
    out = []
    for uevent in sorted(sys_block.glob("*/uevent")):
        fields = dict(line.split("=", 1) for line in uevent.read_text().splitlines() if "=" in line)
        if fields.get("DEVTYPE") == "partition" and "PARTNAME" in fields:
            disk = Path(os.path.realpath(uevent.parent)).parent.name
            out.append(BlockPart(f"/dev/{fields['DEVNAME']}", disk, fields["PARTNAME"]))
    return out


def nvme_disks(sys_block: Path = Path("/sys/block")) -> list[str]:
    return sorted(p.name for p in sys_block.glob("nvme*n*") if "p" not in p.name.split("n", 1)[1])


def situation(boot_source: str, disks: list[str], parts: list[BlockPart]) -> Situation:
    if boot_source == "nvme":
        return Situation.BOOTED_FROM_NVME
    if not disks:
        return Situation.NO_NVME
    if any(p.name == OS_ROOT and p.disk in disks for p in parts):
        return Situation.OTHER_BUILD
    return Situation.BLANK


def layout_scripts(disks: list[str], root_size: int, verity_size: int) -> dict[str, str]:
    """sfdisk scripts: the first NVMe drive gets ESP + OS root + hash tree + state; the others one data
    partition each (for the node's workloads)."""
    first, rest = disks[0], disks[1:]
    scripts = {
        first: "\n".join(
            [
                "label: gpt",
                f'size={32 * MiB // 512}, type={ESP_TYPE}, name="{OS_ESP}"',
                f'size={root_size // 512}, type={ROOT_TYPE}, name="{OS_ROOT}"',
                f'size={verity_size // 512}, type={VERITY_TYPE}, name="{OS_VERITY}"',
                # Named "-new" until formatted: the node's fstab mounts PARTLABEL=rigbase-state as soon as
                # it appears.
                f'type={LINUX_TYPE}, name="{OS_STATE}-new"',
            ]
        )
        + "\n"
    }
    for i, d in enumerate(rest, start=1):
        scripts[d] = f'label: gpt\ntype={LINUX_TYPE}, name="{DATA}-{i}"\n'
    return scripts


class Consoles:
    """Writes to every console that opens; reads the first line typed on any of them."""

    def __init__(self, paths: tuple[str, ...] = CONSOLES) -> None:
        self.fds: list[int] = []
        for p in paths:
            try:
                self.fds.append(os.open(p, os.O_RDWR | os.O_NOCTTY))
            except OSError:
                continue

    def say(self, text: str) -> None:
        for fd in self.fds or [sys.stdout.fileno()]:
            try:
                os.write(fd, text.replace("\n", "\r\n").encode())
            except OSError:
                pass

    def ask(self, prompt: str) -> str:
        self.say(prompt)
        if not self.fds:
            return sys.stdin.readline().strip()
        buffers = {fd: b"" for fd in self.fds}
        for fd in self.fds:
            subprocess.run(["stty", "-F", f"/proc/self/fd/{fd}", "sane", "icanon", "echo"], check=False)
        while True:
            ready, _, _ = select.select(self.fds, [], [])
            for fd in ready:
                chunk = os.read(fd, 256)
                buffers[fd] += chunk
                if b"\n" in buffers[fd] or b"\r" in buffers[fd]:
                    return (
                        buffers[fd].replace(b"\r", b"\n").split(b"\n", 1)[0].decode(errors="replace").strip()
                    )


def _part_dev(disk: str, n: int) -> str:
    return f"/dev/{disk}p{n}" if disk[-1].isdigit() else f"/dev/{disk}{n}"


def _copy(src: str, dst: str, say) -> None:
    with open(src, "rb") as fi, open(dst, "r+b") as fo:
        total = fi.seek(0, os.SEEK_END)
        fi.seek(0)
        done = 0
        while chunk := fi.read(4 * MiB):
            fo.write(chunk)
            done += len(chunk)
            if done % (256 * MiB) < 4 * MiB:
                say(f"  {src} -> {dst}: {done * 100 // total}%\n")
        fo.flush()
        os.fsync(fo.fileno())


def _wait_for(dev: str, seconds: float = 30) -> None:
    end = time.monotonic() + seconds
    while not os.path.exists(dev):
        if time.monotonic() > end:
            raise RuntimeError(f"{dev} did not appear after partitioning")
        time.sleep(0.1)


LAZY = "lazy_itable_init=1,lazy_journal_init=1"


def install(disks: list[str], parts: list[BlockPart], say) -> None:
    usb = {p.name: p.dev for p in parts}
    if USB_ROOT not in usb or USB_VERITY not in usb:
        raise RuntimeError("the USB drive's root partitions are missing")
    sizes = {
        n: int(Path(f"/sys/class/block/{Path(usb[n]).name}/size").read_text()) * 512
        for n in (USB_ROOT, USB_VERITY)
    }
    for disk, script in layout_scripts(disks, sizes[USB_ROOT], sizes[USB_VERITY]).items():
        say(f"Partitioning /dev/{disk} ...\n")
        subprocess.run(["wipefs", "-a", "-q", f"/dev/{disk}"], check=True)
        subprocess.run(
            ["sfdisk", "-q", "--wipe", "always", f"/dev/{disk}"], input=script.encode(), check=True
        )
    first = disks[0]
    subprocess.run(["udevadm", "settle", "--timeout=30"], check=False)
    for n in range(1, 5):
        _wait_for(_part_dev(first, n))
    if MISSING_USB_ESP.exists():
        _copy(str(MISSING_USB_ESP), _part_dev(first, 1), say)
    say("Writing the OS ...\n")
    _copy(usb[USB_ROOT], _part_dev(first, 2), say)
    _copy(usb[USB_VERITY], _part_dev(first, 3), say)
    # Lazy init: the kernel initialises inode tables and the journal in the background after mount
    # instead of mkfs writing them all now (gigabytes on large drives, minutes before the first boot).
    subprocess.run(["mkfs.ext4", "-q", "-F", "-E", LAZY, "-L", OS_STATE, _part_dev(first, 4)], check=True)
    subprocess.run(["sfdisk", "-q", "--part-label", f"/dev/{first}", "4", OS_STATE], check=True)
    for i, disk in enumerate(disks[1:], start=1):
        _wait_for(_part_dev(disk, 1))
        subprocess.run(
            ["mkfs.ext4", "-q", "-F", "-E", LAZY, "-L", f"{DATA}-{i}", _part_dev(disk, 1)], check=True
        )
    os.sync()


def main() -> int:
    source = BOOT_SOURCE.read_text().strip() if BOOT_SOURCE.exists() else "usb"
    disks, parts = nvme_disks(), partitions()
    sit = situation(source, disks, parts)
    action = ACTIONS[sit]
    if action == "skip":
        return 0
    con = Consoles()
    if action == "refuse":
        con.say(
            "rigbase installer: no NVMe drive found; a rigbase node needs at least two NVMe drives. "
            "Add them and reboot.\n"
        )
        return 1
    answer = con.ask("\n" + PROMPTS[sit].format(drives=", ".join(f"/dev/{d}" for d in disks)))
    if answer != "yes":
        con.say("rigbase installer: aborted; nothing was written. Reboot to be asked again.\n")
        return 0
    try:
        install(disks, parts, con.say)
    except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        con.say(
            f"rigbase installer: installation failed ({exc}); check the NVMe drives and reboot to retry.\n"
        )
        return 1
    con.say("rigbase installer: installed; rebooting. Keep the USB drive in: this node boots from it.\n")
    subprocess.run(["systemctl", "reboot"], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
