"""Our own small initramfs: busybox, veritysetup and a handful of kernel modules.

Why not initramfs-tools or dracut: neither sets up a dm-verity root from a root hash on the command line
in bookworm without systemd in the initrd, both embed build-time state, and under QEMU/TCG every second of
early boot counts. This one is a few MB, byte-reproducible, and its /init (below) is the whole policy:
prefer the installed OS on NVMe when it verifies against the root hash, else the USB drive's copy.
"""

from __future__ import annotations

import gzip
import os
import re
import stat
from pathlib import Path

from image_builder import cpio, rootfs
from image_builder.errors import BuildError

#: Modules the initramfs loads (with their dependencies from modules.dep): the storage paths a node boots
#: from (USB, NVMe, SATA, a VM's virtio disk), device-mapper verity, and the filesystems it mounts. ext4
#: needs crc32c by softdep.
MODULES: tuple[str, ...] = (
    "xhci_pci",
    "ehci_pci",
    "uhci_hcd",
    "usb_storage",
    "uas",
    "sd_mod",
    "nvme",
    "ahci",
    "virtio_pci",
    "virtio_blk",
    "virtio_scsi",  # a Compute Engine boot disk (the GCE target) is virtio-scsi on most machine types
    "crc32c_generic",
    "crc32c_intel",
    "ext4",
    "dm_verity",
    "overlay",
    "tpm_crb",
    "tpm_tis",  # the TPM present before systemd-pcrphase-sysinit decides whether to measure
)

#: GPT partition names the initramfs and installer agree on.
USB_ROOT, USB_VERITY = "rigbase-usb-root", "rigbase-usb-verity"
OS_ROOT, OS_VERITY, OS_STATE = "rigbase-os-root", "rigbase-os-verity", "rigbase-state"

INIT = r"""#!/bin/busybox sh
# rigbase initramfs: open the verity-protected root (installed copy on NVMe first, else the USB drive's),
# overlay a tmpfs for writes, and hand over to systemd. The root hash comes from the measured command line.
/bin/busybox --install -s /bin
export PATH=/bin:/sbin
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev
echo 0 > /proc/sys/kernel/printk
for m in $(cat /etc/modules.load); do insmod /lib/modules/$m 2>/dev/null; done
# fail joins its arguments with spaces, so a long message may be split across arguments.
fail() {
  echo "rigbase: $*" > /dev/console; echo "rigbase: $*" > /dev/ttyS0 2>/dev/null
  sleep 2; while :; do sleep 3600; done
}
ROOTHASH=$(sed -n 's/.*rigbase.roothash=\([0-9a-f]*\).*/\1/p' /proc/cmdline)
[ -n "$ROOTHASH" ] || fail "no rigbase.roothash= on the kernel command line; rebuild the boot media."
part() {
  for u in /sys/class/block/*/uevent; do
    grep -qx "PARTNAME=$1" "$u" && { echo /dev/$(sed -n 's/^DEVNAME=//p' "$u"); return 0; }
  done
  return 1
}
i=0
while ! part __USB_ROOT__ >/dev/null && ! part __OS_ROOT__ >/dev/null; do
  i=$((i+1)); [ $i -gt 600 ] && fail "no rigbase boot drive found; plug in the rigbase USB drive and reboot."
  sleep 0.1
done
sleep 0.5  # let the other drives finish probing before choosing
SOURCE=""
if part __OS_ROOT__ >/dev/null && part __OS_VERITY__ >/dev/null &&
  veritysetup open $(part __OS_ROOT__) root $(part __OS_VERITY__) "$ROOTHASH" 2>/dev/null; then
  # open only maps the drive; dm-verity checks blocks as they are read. An installed copy of another image
  # (this boot drive is newer) fails its first block: boot this drive's own root instead.
  if dd if=/dev/mapper/root of=/dev/null bs=4096 count=1 2>/dev/null; then
    SOURCE=nvme
  else
    veritysetup close root
  fi
fi
if [ -z "$SOURCE" ]; then
  part __USB_ROOT__ >/dev/null ||
    fail "the installed OS does not match this boot drive and no USB root was found;" \
      "plug in the matching rigbase USB drive."
  veritysetup open $(part __USB_ROOT__) root $(part __USB_VERITY__) "$ROOTHASH" ||
    fail "verity refused the root filesystem (root hash mismatch);" \
      "the boot drive is corrupt or altered, write it again."
  SOURCE=usb
fi
mkdir -p /lower /rw /newroot
mount -t ext4 -o ro /dev/mapper/root /lower ||
  fail "verity refused the root filesystem (blocks do not match the root hash);" \
    "the boot drive is corrupt or altered, write it again."
mount -t tmpfs -o mode=0755 tmpfs /rw && mkdir -p /rw/upper /rw/work
mount -t overlay overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work /newroot ||
  fail "cannot mount the root overlay."
mkdir -p /newroot/etc/rigbase && echo "$SOURCE" > /newroot/etc/rigbase/boot-source
umount /proc /sys; mount --move /dev /newroot/dev
exec switch_root /newroot /sbin/init
"""


MISSING_USB_INIT = r"""#!/bin/busybox sh
# The NVMe drives' fallback: the node was started without its rigbase USB drive. Say so and wait.
/bin/busybox mount -t devtmpfs devtmpfs /dev
MSG="rigbase: the USB boot drive is missing. Plug in the rigbase USB drive and reboot."
while :; do
  for c in /dev/console /dev/tty0 /dev/ttyS0; do echo "$MSG" > $c 2>/dev/null; done
  /bin/busybox sleep 30
done
"""


def build_missing_usb(tree: Path, out: Path, epoch: int) -> Path:
    """The initramfs of the NVMe drives' fallback UKI: busybox and a message, nothing else."""
    entries = [cpio.Entry(d, stat.S_IFDIR | 0o755) for d in ("bin", "dev")]
    entries.append(cpio.Entry("init", stat.S_IFREG | 0o755, MISSING_USB_INIT.encode()))
    entries.append(
        cpio.Entry("bin/busybox", stat.S_IFREG | 0o755, resolve_in(tree, "bin/busybox").read_bytes())
    )
    out.write_bytes(gzip.compress(cpio.archive(entries, epoch), compresslevel=6, mtime=0))
    return out


def init_script() -> bytes:
    text = INIT
    for k, v in {
        "__USB_ROOT__": USB_ROOT,
        "__USB_VERITY__": USB_VERITY,
        "__OS_ROOT__": OS_ROOT,
        "__OS_VERITY__": OS_VERITY,
    }.items():
        text = text.replace(k, v)
    return text.encode()


def kernel_version(tree: Path) -> str:
    versions = sorted(p.name for p in (tree / "lib/modules").iterdir() if (p / "modules.dep").exists())
    if not versions:
        raise BuildError("the root filesystem has no kernel modules; linux-image-amd64 did not install.")
    return versions[-1]


def module_closure(tree: Path, kver: str, names: tuple[str, ...]) -> list[str]:
    """Module paths (relative to lib/modules/KVER) in load order: dependencies first."""
    moddir = tree / "lib/modules" / kver
    deps: dict[str, list[str]] = {}
    by_name: dict[str, str] = {}
    for line in (moddir / "modules.dep").read_text().splitlines():
        path, _, rest = line.partition(":")
        deps[path] = rest.split()
        base = os.path.basename(path).split(".ko")[0].replace("-", "_")
        by_name[base] = path
    builtin = {
        os.path.basename(entry).split(".ko")[0].replace("-", "_")
        for entry in (moddir / "modules.builtin").read_text().splitlines()
    }
    order: list[str] = []

    def visit(path: str) -> None:
        if path in order:
            return
        for dep in deps.get(path, []):
            visit(dep)
        order.append(path)

    for name in names:
        if name in by_name:
            visit(by_name[name])
        elif name not in builtin:
            raise BuildError(f"kernel module {name} is neither a module nor built into {kver}.")
    return order


def _needed_libs(tree: Path, binary: str) -> list[str]:
    out = rootfs.chroot(tree, "ldd", binary).stdout
    libs = re.findall(r"(/\S+\.so[.\d]*)", out)
    return sorted(set(libs))


def resolve_in(tree: Path, rel: str) -> Path:
    """Follow symlinks as if `tree` were / (absolute links in the chroot must not escape to the host)."""
    parts = [p for p in rel.strip("/").split("/") if p]
    resolved: list[str] = []
    hops = 0
    while parts:
        name = parts.pop(0)
        if name == "..":
            if resolved:
                resolved.pop()
            continue
        candidate = tree.joinpath(*resolved, name)
        if candidate.is_symlink():
            hops += 1
            if hops > 40:
                raise BuildError(f"symlink loop at {rel} in the root filesystem.")
            target = os.readlink(candidate)
            parts = [p for p in target.split("/") if p and p != "."] + parts
            if target.startswith("/"):
                resolved = []
            continue
        resolved.append(name)
    return tree.joinpath(*resolved)


def _file_entry(tree: Path, rel: str) -> list[cpio.Entry]:
    """The file's resolved contents under its own path (keeps the dynamic loader's paths working)."""
    real = resolve_in(tree, rel)
    mode = stat.S_IMODE(real.stat().st_mode)
    return [cpio.Entry(rel.lstrip("/"), stat.S_IFREG | mode, real.read_bytes())]


def build(tree: Path, out: Path, epoch: int) -> Path:
    kver = kernel_version(tree)
    entries: dict[str, cpio.Entry] = {}

    def add(e: cpio.Entry) -> None:
        parts = e.path.split("/")
        for i in range(1, len(parts)):
            d = "/".join(parts[:i])
            entries.setdefault(d, cpio.Entry(d, stat.S_IFDIR | 0o755))
        entries[e.path] = e

    for d in ("dev", "proc", "sys", "run", "tmp", "etc", "sbin", "lib64", "newroot"):
        add(cpio.Entry(d, stat.S_IFDIR | 0o755))
    add(cpio.Entry("init", stat.S_IFREG | 0o755, init_script()))
    add(cpio.Entry("bin/busybox", stat.S_IFREG | 0o755, resolve_in(tree, "bin/busybox").read_bytes()))
    add(cpio.Entry("bin/sh", stat.S_IFLNK | 0o777, b"busybox"))
    for e in _file_entry(tree, "/sbin/veritysetup"):
        add(cpio.Entry("sbin/veritysetup", e.mode, e.data))
    for lib in _needed_libs(tree, "/sbin/veritysetup"):
        for e in _file_entry(tree, lib):
            add(e)
    mods = module_closure(tree, kver, MODULES)
    for m in mods:
        add(
            cpio.Entry(
                f"lib/modules/{m}", stat.S_IFREG | 0o644, (tree / "lib/modules" / kver / m).read_bytes()
            )
        )
    add(cpio.Entry("etc/modules.load", stat.S_IFREG | 0o644, ("\n".join(mods) + "\n").encode()))
    # gzip with mtime 0: deterministic, and half the bytes firmware must read from a USB stick.
    out.write_bytes(gzip.compress(cpio.archive(list(entries.values()), epoch), compresslevel=6, mtime=0))
    return out
