"""What the minion found on this machine, as plain dataclasses.

The join engineer sends `Inventory.to_json()` to the control plane and `minion check --inventory FILE`
reads it back on another machine, so the JSON form is a contract: `from_json(to_json())` is lossless and
a malformed document raises `InvalidInventory` with one sentence saying what is wrong. Sizes are bytes
and speeds are the units sysfs uses (GT/s, Mb/s) so nothing is lost to rounding; formatting for people
lives in units.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from functools import lru_cache
from typing import Any

from contracts.catalogue import GpuClass
from contracts.device import DeviceReport
from minion.hardware.units import pcie_generation

SCHEMA_VERSION = 1


class FormFactor(StrEnum):
    PCIE = "pcie"
    SXM = "sxm"
    UNKNOWN = "unknown"


class DriveKind(StrEnum):
    NVME = "nvme"
    SATA = "sata"
    SAS = "sas"  # any SCSI-attached, non-ATA, non-USB disk (SAS HBAs, RAID volumes)


class InvalidInventory(ValueError):
    """A saved inventory that cannot be read back."""


@dataclass
class PcieLink:
    """The GPU's PCIe link from sysfs, or from NVML where it answers. `port_max_speed_gts` is the upstream
    port's capability: a PCIe 4.0 GPU in a PCIe 3.0 slot runs at 3.0, and that is what the cores-per-GPU
    rule cares about."""

    current_speed_gts: float | None = None
    current_width: int | None = None
    max_speed_gts: float | None = None
    max_width: int | None = None
    port_max_speed_gts: float | None = None
    max_generation: int | None = None  # NVML's: the generation the GPU and its slot run at together

    @property
    def generation(self) -> int | None:
        """Generation the link can run at: NVML's when it answered, else the lower of the GPU's and the
        slot's maximum in sysfs. The current speed is not used because idle GPUs train their link down
        to 2.5 GT/s to save power."""
        if self.max_generation:
            return self.max_generation
        speeds = [s for s in (self.max_speed_gts, self.port_max_speed_gts) if s]
        return pcie_generation(min(speeds)) if speeds else None


@dataclass
class Gpu:
    pci_address: str
    vendor_id: str
    device_id: str
    vendor: str
    name: str
    model: str
    vram_bytes: int | None = None
    gpu_class: GpuClass | None = None
    form_factor: FormFactor = FormFactor.UNKNOWN
    catalogue_pcie_gen: int | None = None
    driver: str | None = None
    link: PcieLink = field(default_factory=PcieLink)
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def pcie_gen(self) -> int | None:
        """Live link generation when sysfs has it, else the catalogue's."""
        return self.link.generation or self.catalogue_pcie_gen


@dataclass
class Drive:
    name: str
    kind: DriveKind
    size_bytes: int
    rotational: bool | None = None
    rpm: int | None = None
    model: str | None = None


@dataclass
class Tpm:
    present: bool
    major_version: int | None = None
    device: str | None = None
    source: str | None = None


@dataclass
class Nic:
    name: str
    speed_mbps: int | None = None
    link_up: bool | None = None
    mac: str | None = None


@dataclass
class Address:
    """One of the machine's IP addresses and its interface (minion/hardware/addresses.py): where the
    workers of a distributed job on other nodes of the region reach this one."""

    interface: str
    address: str


@dataclass
class Cpu:
    physical_cores: int
    threads: int
    sockets: int = 1
    model: str | None = None


@dataclass
class Inventory:
    hostname: str
    cpu: Cpu
    memory_total_bytes: int
    tpm: Tpm
    gpus: list[Gpu] = field(default_factory=list)
    drives: list[Drive] = field(default_factory=list)
    nics: list[Nic] = field(default_factory=list)
    addresses: list[Address] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # an edge device (Jetson): contracts/device.py; None on a compute or storage node
    device: DeviceReport | None = None
    schema: int = SCHEMA_VERSION

    @property
    def nvme_drives(self) -> list[Drive]:
        return [d for d in self.drives if d.kind is DriveKind.NVME]

    @property
    def sata_drives(self) -> list[Drive]:
        return [d for d in self.drives if d.kind in (DriveKind.SATA, DriveKind.SAS)]

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (`json.dumps` it, or hand it to httpx as `json=`)."""
        return _adapter().dump_python(self, mode="json")

    @classmethod
    def from_json(cls, data: dict[str, Any] | str | bytes) -> Inventory:
        """Read a document `to_json` wrote; a str/bytes argument is parsed as JSON first."""
        from pydantic import ValidationError

        try:
            if isinstance(data, (str, bytes)):
                data = json.loads(data)
            return _adapter().validate_python(data)
        except json.JSONDecodeError as exc:
            raise InvalidInventory(
                f"the inventory is not JSON ({exc.msg} at line {exc.lineno}); "
                "save it with `minion inventory --json > FILE`"
            ) from None
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "document"
            raise InvalidInventory(
                f"the inventory field '{where}' is invalid ({first['msg']}); "
                "save it again with `minion inventory --json > FILE`"
            ) from None


@lru_cache(maxsize=1)
def _adapter() -> Any:
    # pydantic validates nested dataclasses and enums for us; imported lazily so `minion --help`
    # stays quick.
    from pydantic import TypeAdapter

    return TypeAdapter(Inventory)
