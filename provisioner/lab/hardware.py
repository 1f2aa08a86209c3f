"""Simulated hardware for lab nodes and tests: a hardware profile (YAML: GPUs, drives, TPM, NICs, /proc
facts) becomes a umockdev record file plus a host root holding proc/meminfo, proc/cpuinfo and
proc/sys/kernel/hostname.

The record file uses the format `umockdev-record` writes (P: devpath, E: property, A: attribute,
H: hex attribute, L: link) and is laid out like a real sysfs tree: GPUs and NVMe controllers behind PCIe
root ports, SATA disks under ata ports, a USB boot stick, virtual NICs, a BMC VGA and an NVSwitch that
must not count. `umockdev-run -d FILE -- minion …` then shows the minion exactly these devices through
the real libudev/pyudev, which is how a lab node "has" 8 GPUs on a machine without any.

Product code (the lab uses it for every simulated node); the hardware tests' fixtures
(tests/fixtures/umockdev.py) and bench/bench_inventory.py build their testbeds with the same functions.
Lab profiles live in provisioner/lab/profiles/; the test profiles (with expected verdicts) in
tests/minion/profiles/.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

PROFILES_DIR = Path(__file__).resolve().parent / "profiles"
SECTOR = 512
GPU_BUS, NVME_BUS, NIC_BUS, SAS_BUS = 0x01, 0x40, 0x80, 0xA0
PCIE_GEN_SPEED = {
    1: "2.5 GT/s PCIe",
    2: "5.0 GT/s PCIe",
    3: "8.0 GT/s PCIe",
    4: "16.0 GT/s PCIe",
    5: "32.0 GT/s PCIe",
}


class _Record:
    """Accumulates devices in umockdev's record format."""

    def __init__(self) -> None:
        self.blocks: list[str] = []

    def add(
        self,
        devpath: str,
        subsystem: str,
        *,
        attrs: dict[str, Any] | None = None,
        props: dict[str, Any] | None = None,
        driver: str | None = None,
    ) -> str:
        lines = [f"P: {devpath}", f"E: SUBSYSTEM={subsystem}"]
        for key, value in (props or {}).items():
            if value is not None:
                lines.append(f"E: {key}={value}")
        if driver:
            depth = devpath.count("/")  # from /sys/<devpath> up to /sys
            lines.append(f"L: driver={'../' * depth}bus/{subsystem}/drivers/{driver}")
        for key, value in (attrs or {}).items():
            if value is None:
                continue
            text = str(value)
            if "\n" in text:  # multi-line attributes (TPM 1.2 caps) go in hex form
                lines.append(f"H: {key}={text.encode().hex().upper()}")
            else:
                lines.append(f"A: {key}={text}")
        self.blocks.append("\n".join(lines))
        return devpath

    def text(self) -> str:
        return "\n\n".join(self.blocks) + "\n"


def _root_port(rec: _Record, bus: int, gen: int, width: int) -> str:
    return rec.add(
        f"/devices/pci0000:00/0000:00:{bus:02x}.0",
        "pci",
        attrs={
            "class": "0x060400",
            "vendor": "0x8086",
            "device": "0x347a",
            "max_link_speed": PCIE_GEN_SPEED[gen],
            "max_link_width": width,
            "current_link_speed": PCIE_GEN_SPEED[gen],
            "current_link_width": width,
        },
    )


def _pci_function(
    rec: _Record,
    port: str,
    bus: int,
    vendor: str,
    device: str,
    pci_class: str,
    *,
    link_gen: int | None = None,
    width: int | None = None,
    max_gen: int | None = None,
    max_width: int | None = None,
    driver: str | None = None,
    extra: dict[str, Any] | None = None,
) -> str:
    attrs: dict[str, Any] = {"class": pci_class, "vendor": f"0x{vendor}", "device": f"0x{device}"}
    if link_gen is not None:
        attrs.update(
            {
                "current_link_speed": PCIE_GEN_SPEED[link_gen],
                "current_link_width": width,
                "max_link_speed": PCIE_GEN_SPEED[max_gen or link_gen],
                "max_link_width": max_width or width,
            }
        )
    attrs.update(extra or {})
    return rec.add(
        f"{port}/0000:{bus:02x}:00.0",
        "pci",
        attrs=attrs,
        driver=driver,
        props={"PCI_ID": f"{vendor.upper()}:{device.upper()}", "DRIVER": driver},
    )


def _disk_letters() -> Any:
    n = 0
    while True:
        name, value = "", n
        while True:
            name = chr(ord("a") + value % 26) + name
            value = value // 26 - 1
            if value < 0:
                break
        yield f"sd{name}"
        n += 1


def _expand(items: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    return [item for item in (items or []) for _ in range(int(item.get("count", 1)))]


def record_text(profile: dict[str, Any]) -> str:  # noqa: C901
    rec = _Record()
    bus = GPU_BUS
    for gpu in _expand(profile.get("gpus")):
        vendor, device = gpu["id"].split(":")
        gen = int(gpu["gen"])
        port = _root_port(rec, bus, int(gpu.get("port_gen", gen)), int(gpu.get("port_width", 16)))
        _pci_function(
            rec,
            port,
            bus,
            vendor,
            device,
            gpu.get("class", "0x030200"),
            link_gen=gen,
            width=int(gpu.get("width", 16)),
            max_width=int(gpu.get("max_width", 16)),
            max_gen=int(gpu.get("max_gen", gen)),
            driver=gpu.get("driver"),
            extra={"mem_info_vram_total": gpu.get("sysfs_vram_bytes")},
        )
        bus += 1
    for extra in profile.get("other_pci", []):  # BMC VGA, NVSwitch, ...: must not count as GPUs
        vendor, device = extra["id"].split(":")
        port = _root_port(rec, bus, 3, 1)
        _pci_function(rec, port, bus, vendor, device, extra["class"])
        bus += 1
    for i, nvme in enumerate(_expand(profile.get("nvme"))):
        port = _root_port(rec, NVME_BUS + i, 4, 4)
        ctrl = _pci_function(
            rec, port, NVME_BUS + i, "144d", "a80a", "0x010802", link_gen=4, width=4, driver="nvme"
        )
        ctrl_dev = rec.add(f"{ctrl}/nvme/nvme{i}", "nvme", attrs={"model": nvme.get("model", "NVMe SSD")})
        nvme_disk = rec.add(
            f"{ctrl_dev}/nvme{i}n1",
            "block",
            attrs={"size": nvme["bytes"] // SECTOR, "queue/rotational": 0, "removable": 0},
            props={"DEVTYPE": "disk", "DEVNAME": f"/dev/nvme{i}n1", "ID_MODEL": nvme.get("model")},
        )
        rec.add(f"{nvme_disk}/nvme{i}n1p1", "block", attrs={"size": 2048}, props={"DEVTYPE": "partition"})
    letters = _disk_letters()
    ahci = "/devices/pci0000:00/0000:00:17.0"
    rec.add(ahci, "pci", attrs={"class": "0x010601", "vendor": "0x8086", "device": "0xa352"}, driver="ahci")
    for i, disk in enumerate(_expand(profile.get("sata"))):
        name = next(letters)
        rec.add(
            f"{ahci}/ata{i + 1}/host{i}/target{i}:0:0/{i}:0:0:0/block/{name}",
            "block",
            attrs={
                "size": disk["bytes"] // SECTOR,
                "queue/rotational": int(disk.get("rotational", False)),
                "removable": 0,
            },
            props={
                "DEVTYPE": "disk",
                "ID_BUS": "ata",
                "ID_ATA": 1,
                "ID_MODEL": disk.get("model"),
                "ID_ATA_ROTATION_RATE_RPM": disk.get("rpm"),
            },
        )
    sas_host = 32
    for i, disk in enumerate(_expand(profile.get("sas"))):
        name = next(letters)
        rec.add(
            f"/devices/pci0000:00/0000:00:1c.0/0000:{SAS_BUS:02x}:00.0/host{sas_host}/port-{sas_host}:{i}"
            f"/end_device-{sas_host}:{i}/target{sas_host}:0:{i}/{sas_host}:0:{i}:0/block/{name}",
            "block",
            attrs={
                "size": disk["bytes"] // SECTOR,
                "queue/rotational": int(disk.get("rotational", False)),
                "removable": 0,
            },
            props={"DEVTYPE": "disk", "ID_BUS": "scsi", "ID_MODEL": disk.get("model")},
        )
    for i, stick in enumerate(_expand(profile.get("usb"))):  # the rigbase boot drive: never counted
        name = next(letters)
        port = f"usb1/1-{i + 1}/1-{i + 1}:1.0"
        rec.add(
            f"/devices/pci0000:00/0000:00:14.0/{port}/host{40 + i}/target{40 + i}:0:0"
            f"/{40 + i}:0:0:0/block/{name}",
            "block",
            attrs={"size": stick["bytes"] // SECTOR, "queue/rotational": 0, "removable": 1},
            props={"DEVTYPE": "disk", "ID_BUS": "usb"},
        )
    tpm = profile.get("tpm")
    if tpm:
        base = "/devices/platform/MSFT0101:00"
        style = tpm.get("style", "major")
        attrs: dict[str, Any] = {}
        if style == "major":
            attrs["tpm_version_major"] = tpm["version"]
        elif style == "caps":  # pre-5.6 kernels: only TPM 1.2 has caps
            attrs["caps"] = "Manufacturer: 0x49465800\nTCG version: 1.2\nFirmware version: 6.40\n"
        rec.add(f"{base}/tpm/tpm0", "tpm", attrs=attrs, props={"DEVNAME": "/dev/tpm0"})
        if tpm["version"] == 2:
            rec.add(f"{base}/tpmrm/tpmrm0", "tpmrm", props={"DEVNAME": "/dev/tpmrm0"})
    for i, nic in enumerate(profile.get("nics", [])):
        port = _root_port(rec, NIC_BUS + i, 3, 8)
        fn = _pci_function(rec, port, NIC_BUS + i, "15b3", "1017", "0x020000", link_gen=3, width=8)
        up = nic.get("up", True)
        rec.add(
            f"{fn}/net/{nic['name']}",
            "net",
            props={"INTERFACE": nic["name"]},
            attrs={
                "type": 1,
                "speed": nic.get("speed") if up else None,
                "operstate": "up" if up else "down",
                "address": f"0c:42:a1:00:00:{i:02x}",
            },
        )
    rec.add("/devices/virtual/net/lo", "net", attrs={"type": 772, "operstate": "unknown"})
    rec.add("/devices/virtual/net/br0", "net", attrs={"type": 1, "speed": 100000, "operstate": "up"})
    return rec.text()


def write_host_root(profile: dict[str, Any], root: Path) -> Path:
    host = profile["host"]
    proc = root / "proc"
    (proc / "sys" / "kernel").mkdir(parents=True, exist_ok=True)
    (proc / "sys" / "kernel" / "hostname").write_text(host.get("hostname", profile["name"]) + "\n")
    kib = int(float(host["memory_gib"]) * 1024 * 1024)
    (proc / "meminfo").write_text(f"MemTotal:       {kib} kB\nMemFree:        {kib // 2} kB\n")
    blocks = []
    sockets, cores, threads = host["sockets"], host["cores_per_socket"], host.get("threads_per_core", 1)
    processor = 0
    for _thread in range(threads):
        for socket in range(sockets):
            for core in range(cores):
                blocks.append(
                    f"processor\t: {processor}\nvendor_id\t: GenuineIntel\n"
                    f"model name\t: {host.get('cpu_model', 'Test CPU')}\nphysical id\t: {socket}\n"
                    f"siblings\t: {cores * threads}\ncore id\t\t: {core}\ncpu cores\t: {cores}\n"
                    f"flags\t\t: fpu sse2 ht\n"
                )
                processor += 1
    (proc / "cpuinfo").write_text("\n".join(blocks) + "\n")
    return root


def load_profile(name: str, directory: Path = PROFILES_DIR) -> dict[str, Any]:
    """A profile by name from `directory` (default: the lab's own profiles); `name` is set from the file."""
    path = directory / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in directory.glob("*.yaml"))) or "none"
        raise FileNotFoundError(f"no hardware profile {name!r} in {directory} (known: {known})")
    profile = yaml.safe_load(path.read_text())
    profile["name"] = name
    return profile


def write_testbed(profile: dict[str, Any], directory: Path) -> tuple[Path, Path]:
    """Write `<name>.umockdev` and the host root `host/` under `directory`; return (record, host root)."""
    directory.mkdir(parents=True, exist_ok=True)
    record = directory / f"{profile['name']}.umockdev"
    record.write_text(record_text(profile))
    return record, write_host_root(profile, directory / "host")


def gpu_count(profile: dict[str, Any]) -> int:
    """How many GPUs the profile's node has (its lab CDI spec gets one device each)."""
    return len(_expand(profile.get("gpus")))


def write_jetson_files(profile: dict[str, Any], root: Path) -> Path:
    """What a Jetson's kernel and L4T show and minion/hardware/jetson.py reads, written under a device's
    host root from the profile's `jetson` section: the device tree's model and compatible (NUL-separated
    string lists), the fused Tegra chip id and /etc/nv_tegra_release. MemTotal is write_host_root's."""
    jetson = profile["jetson"]
    tree = root / "proc" / "device-tree"
    tree.mkdir(parents=True, exist_ok=True)
    (tree / "model").write_bytes(jetson["model"].encode() + b"\0")
    (tree / "compatible").write_bytes(b"".join(c.encode() + b"\0" for c in jetson["compatible"]))
    fuse = root / "sys" / "module" / "tegra_fuse" / "parameters"
    fuse.mkdir(parents=True, exist_ok=True)
    (fuse / "tegra_chip_id").write_text(f"{jetson['tegra_chip_id']}\n")
    (root / "etc").mkdir(parents=True, exist_ok=True)
    (root / "etc" / "nv_tegra_release").write_text(f"{jetson['nv_tegra_release']}\n")
    return root
