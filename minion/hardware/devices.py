"""Devices from sysfs and the udev database, through pyudev.

Only pyudev is used here (never lspci/lsblk output), so umockdev testbeds drive these functions in tests
exactly as a real /sys does in production. Without udevd (a bare container, an initramfs before udev) the
udev properties are missing; every reader falls back to what sysfs alone says and never raises for a
missing attribute.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from minion.hardware.model import Drive, DriveKind, Nic, PcieLink, Tpm
from minion.hardware.units import parse_link_speed

GPU_VENDORS = {"10de": "NVIDIA", "1002": "AMD"}
DISPLAY_CLASS_PREFIX = "03"  # PCI base class 0x03: display controllers (VGA 0300, 3D 0302, other 0380)
SECTOR = 512  # sysfs block `size` is in 512-byte sectors whatever the drive's logical block size
ARPHRD_ETHER = 1

_NVME_NAMESPACE = re.compile(r"^nvme\d+n\d+$")  # not nvme0c0n1: multipath paths are hidden duplicates
_SCSI_DISK = re.compile(r"^sd[a-z]+$")


def attribute(device: Any, name: str) -> str | None:
    """A sysfs attribute as stripped text, or None when missing or unreadable (a NIC without link
    answers EINVAL for `speed`)."""
    try:
        value = device.attributes.get(name)
    except (OSError, UnicodeDecodeError):
        return None
    if value is None:
        return None
    return value.decode(errors="replace").strip() if isinstance(value, bytes) else str(value).strip()


def int_attribute(device: Any, name: str, base: int = 10) -> int | None:
    text = attribute(device, name)
    try:
        return int(text, base) if text is not None else None
    except ValueError:
        return None


def _hex_id(device: Any, name: str) -> str | None:
    text = attribute(device, name)
    return text.lower().removeprefix("0x") if text else None


@dataclass
class PciGpu:
    """A display-class PCI function from a GPU vendor, before catalogue and NVML fill in the rest."""

    pci_address: str
    vendor_id: str
    device_id: str
    driver: str | None
    link: PcieLink
    sysfs_vram_bytes: int | None  # amdgpu publishes mem_info_vram_total; NVIDIA publishes nothing


def gpus(context: Any) -> list[PciGpu]:
    found: list[PciGpu] = []
    for device in context.list_devices(subsystem="pci"):
        pci_class = _hex_id(device, "class")
        vendor_id = _hex_id(device, "vendor")
        if not pci_class or not pci_class.zfill(6).startswith(DISPLAY_CLASS_PREFIX):
            continue
        if vendor_id not in GPU_VENDORS:
            continue  # the BMC's ASPEED VGA, an Intel iGPU: not GPUs jobs can use
        parent = device.parent
        port_speed = None
        if parent is not None and parent.subsystem == "pci":
            port_speed = parse_link_speed(attribute(parent, "max_link_speed"))
        link = PcieLink(
            current_speed_gts=parse_link_speed(attribute(device, "current_link_speed")),
            current_width=int_attribute(device, "current_link_width"),
            max_speed_gts=parse_link_speed(attribute(device, "max_link_speed")),
            max_width=int_attribute(device, "max_link_width"),
            port_max_speed_gts=port_speed,
        )
        found.append(
            PciGpu(
                pci_address=device.sys_name,
                vendor_id=vendor_id,
                device_id=_hex_id(device, "device") or "0000",
                driver=device.driver,
                link=link,
                sysfs_vram_bytes=int_attribute(device, "mem_info_vram_total"),
            )
        )
    return sorted(found, key=lambda gpu: gpu.pci_address)


def _scsi_kind(device: Any) -> DriveKind | None:
    """SATA, SAS, or None for USB sticks (the rigbase boot drive is one; it must not count)."""
    bus = device.properties.get("ID_BUS")
    path = device.sys_path
    if bus == "usb" or "/usb" in path:
        return None
    if bus == "ata" or (bus is None and "/ata" in path):
        return DriveKind.SATA
    return DriveKind.SAS


def drives(context: Any) -> list[Drive]:
    found: list[Drive] = []
    for device in context.list_devices(subsystem="block"):
        if device.device_type != "disk":
            continue
        name = device.sys_name
        if _NVME_NAMESPACE.match(name):
            kind: DriveKind | None = DriveKind.NVME
        elif _SCSI_DISK.match(name):
            kind = _scsi_kind(device)
        else:
            continue  # loop, dm, md, zram, sr: not drives the rules count
        sectors = int_attribute(device, "size")
        if kind is None or not sectors or attribute(device, "removable") == "1":
            continue
        rotational = attribute(device, "queue/rotational")
        rpm = device.properties.get("ID_ATA_ROTATION_RATE_RPM")
        found.append(
            Drive(
                name=name,
                kind=kind,
                size_bytes=sectors * SECTOR,
                rotational=None if rotational is None else rotational == "1",
                rpm=int(rpm) if rpm and rpm.isdigit() else None,
                model=device.properties.get("ID_MODEL") or attribute(device, "device/model"),
            )
        )
    return sorted(found, key=lambda drive: (drive.kind.value, drive.name))


def tpm(context: Any) -> Tpm:
    """The first TPM of the tpm class and its major version.

    tpm_version_major exists since Linux 5.6; older kernels show a TPM 1.2 by its `caps` file and a TPM
    2.0 by the resource-manager node tpmrmN that only 2.0 devices get."""
    devices = sorted(context.list_devices(subsystem="tpm"), key=lambda d: d.sys_name)
    if not devices:
        return Tpm(present=False, source="sysfs: no device in the tpm class")
    device = devices[0]
    major = int_attribute(device, "tpm_version_major")
    source = "sysfs tpm_version_major"
    if major is None:
        caps = attribute(device, "caps") or ""
        version = re.search(r"TCG version:\s*(\d+)\.", caps)
        if version:
            major, source = int(version.group(1)), "sysfs caps"
        elif any(True for _ in context.list_devices(subsystem="tpmrm")):
            major, source = 2, "sysfs tpmrm device"
        else:
            source = "sysfs: version not published"
    return Tpm(present=True, major_version=major, device=device.sys_name, source=source)


def nics(context: Any) -> list[Nic]:
    """Physical Ethernet interfaces. Virtual ones (bridges, veths, bonds) live under /devices/virtual
    and would double-count or invent speeds, so they are left out."""
    found: list[Nic] = []
    for device in context.list_devices(subsystem="net"):
        if "/devices/virtual/" in device.sys_path:
            continue
        if int_attribute(device, "type") not in (None, ARPHRD_ETHER):
            continue
        speed = int_attribute(device, "speed")
        operstate = attribute(device, "operstate")
        found.append(
            Nic(
                name=device.sys_name,
                speed_mbps=speed if speed and speed > 0 else None,
                link_up=None if operstate in (None, "unknown") else operstate == "up",
                mac=attribute(device, "address"),
            )
        )
    return sorted(found, key=lambda nic: nic.name)
