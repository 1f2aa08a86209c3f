"""The build plan as plain data: the steps in order, what each reads and writes, and the fixed
identifiers that make the output reproducible. `image-builder build --plan` prints it."""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

_NS = uuid.UUID("3a1f0d5e-6b4c-4e8a-9f2d-7c1b0e5a9d42")


def fixed_uuid(name: str) -> str:
    """Stable UUIDs (uuid5 of a rigbase namespace) for the disk, its partitions and filesystems."""
    return str(uuid.uuid5(_NS, name))


#: Every identifier mkfs/sfdisk/veritysetup would otherwise randomise.
IDS: dict[str, str] = {
    "disk_guid": fixed_uuid("disk"),
    "esp_partuuid": fixed_uuid("esp-partition"),
    "root_partuuid": fixed_uuid("root-partition"),
    "verity_partuuid": fixed_uuid("verity-partition"),
    "root_fs_uuid": fixed_uuid("root-filesystem"),
    "esp_volume_id": "52494742",  # "RIGB"
    "nvme_esp_volume_id": "52494745",
    "gce_disk_guid": fixed_uuid("gce-disk"),
    "gce_esp_partuuid": fixed_uuid("gce-esp-partition"),
    "gce_root_partuuid": fixed_uuid("gce-root-partition"),
    "gce_verity_partuuid": fixed_uuid("gce-verity-partition"),
    "gce_state_partuuid": fixed_uuid("gce-state-partition"),
    "gce_state_fs_uuid": fixed_uuid("gce-state-filesystem"),
    "gce_esp_volume_id": "52494747",
}

ESP_NAME = "rigbase-esp"
IMAGE_NAME = "rigbase-usb.img"
UKI_NAME = "rigbase.efi"
MANIFEST_NAME = "manifest.json"
GCE_ARCHIVE = "rigbase-gce.tar.gz"  # --target gce: what `provision image publish --provider gcp` uploads
GCE_DISK = "disk.raw"  # the one file in it, as images.insert requires

#: What `--target` may name. usb is always built: its image is the manifest's `image` section.
TARGETS = ("usb", "gce")

#: The kernel command line (the root hash is appended). Both consoles, so the installer and the banner
#: reach a VGA screen and a serial-over-LAN session; gpt-auto off because the initramfs chose the root.
CMDLINE = "console=tty0 console=ttyS0,115200 ro panic=30 systemd.gpt_auto=0 systemd.show_status=auto"


@dataclass(frozen=True)
class PlanStep:
    name: str
    why: str
    reads: tuple[str, ...]
    writes: tuple[str, ...]


STEPS: tuple[PlanStep, ...] = (
    PlanStep(
        "base",
        "debootstrap bookworm minbase + node packages, cached by inputs",
        ("mirror", "package set"),
        ("cache/rootfs/KEY/tree",),
    ),
    PlanStep("wheel", "pip wheel --no-deps of this repository", ("source tree",), ("work/rigbase-*.whl",)),
    PlanStep(
        "deps",
        "pip wheel of the minion's pinned dependencies and ansible-core/-runner, cached by the pinned set",
        ("host venv versions",),
        ("cache/wheelhouse/KEY",),
    ),
    PlanStep(
        "stage",
        "hard-link the base tree, add the minion, units, banner, installer ESP, Ansible collections",
        ("base", "wheel", "deps", "host venv's ansible-collections"),
        ("work/stage",),
    ),
    PlanStep(
        "rootfs",
        "mkfs.ext4 -d with fixed UUID and hash seed, timestamps pinned",
        ("stage",),
        ("work/root.ext4",),
    ),
    PlanStep(
        "verity", "veritysetup format with a fixed salt → root hash", ("rootfs",), ("work/root.verity",)
    ),
    PlanStep(
        "initramfs",
        "busybox + veritysetup + storage modules, reproducible cpio",
        ("base",),
        ("work/initrd.cpio",),
    ),
    PlanStep(
        "uki",
        "systemd-stub + kernel + initramfs + cmdline (with root hash) + os-release; PE timestamp pinned",
        ("base", "initramfs", "verity"),
        (UKI_NAME,),
    ),
    PlanStep(
        "esp",
        "FAT ESP: systemd-boot, the UKI, loader.conf, the region bundle",
        ("uki", "bundle"),
        ("work/esp.img",),
    ),
    PlanStep("disk", "GPT with fixed GUIDs: ESP, root, verity", ("esp", "rootfs", "verity"), (IMAGE_NAME,)),
    PlanStep(
        "gce",
        "--target gce: ESP without the bundle, root, verity, a growable state partition → disk.raw (whole "
        "GiB) in a gzip'd tar",
        ("uki", "rootfs", "verity"),
        (GCE_ARCHIVE,),
    ),
    PlanStep(
        "measure", "PCR 11 per phase (systemd-measure), PCR 12, Authenticode digests for PCR 4", ("uki",), ()
    ),
    PlanStep(
        "manifest",
        "manifest.json + Ed25519 detached signature",
        ("disk", "measure"),
        (MANIFEST_NAME, MANIFEST_NAME + ".sig"),
    ),
)


@dataclass(frozen=True)
class BuildConfig:
    bundle: Path
    output: Path
    cache: Path
    key: Path
    with_nvidia: bool = False
    source_date_epoch: int = 0
    repo: Path = Path(".")
    mirror: str | None = None
    targets: tuple[str, ...] = ("usb",)

    def as_plan(self) -> dict[str, Any]:
        return {
            "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()},
            "ids": IDS,
            "cmdline": CMDLINE,
            "steps": [asdict(s) for s in STEPS],
        }
