"""`image-builder build`: run the plan (plan.py) step by step.

Output is written to a temporary directory next to --output and renamed into place at the end, so a failed
build leaves nothing half-written where an operator would flash it from."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contracts.bundle import BundleError, read_bundle_bytes
from image_builder import (
    bytecode,
    disk,
    ext4,
    gce,
    initramfs,
    manifest,
    measure,
    node_ansible,
    node_files,
    nvidia,
    pe,
    rootfs,
    staging,
    uki,
    verity,
    wheel,
)
from image_builder.errors import BuildError
from image_builder.plan import CMDLINE, ESP_NAME, IDS, IMAGE_NAME, MANIFEST_NAME, UKI_NAME, BuildConfig

BUILDER_VERSION = "1"
VERSION = "0.1.0"
MiB = 2**20

#: The PE images firmware loads on the USB boot path, in order, as the boot test's event log shows:
#: systemd-boot (\\EFI\\BOOT\\BOOTX64.EFI), the UKI it starts, and the kernel systemd-stub loads with
#: LoadImage.
USB_BOOT_PATH: tuple[str, ...] = ("systemd-boot", "uki", "kernel")


@dataclass
class Timings:
    steps: dict[str, float] = field(default_factory=dict)

    def run(self, name: str, fn: Callable[[], Any], log: Callable[[str], None]) -> Any:
        t0 = time.monotonic()
        log(f"[{name}] ...")
        result = fn()
        self.steps[name] = round(time.monotonic() - t0, 2)
        log(f"[{name}] done in {self.steps[name]:.1f}s")
        return result


def sha256_file(path: Path) -> str:
    md = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(8 * MiB):
            md.update(chunk)
    return md.hexdigest()


def read_bundle(path: Path) -> tuple[bytes, dict[str, Any]]:
    """The bundle's exact bytes (copied onto the ESP, digested into the manifest) and its fields."""
    try:
        raw, bundle = read_bundle_bytes(path)
    except BundleError as exc:
        raise BuildError(exc.message, code=exc.code) from None
    return raw, bundle.model_dump(mode="json")


def default_epoch(repo: Path, pinned: int | None = None) -> int:
    """`pinned` (SOURCE_DATE_EPOCH, BuilderSettings) if given, else the last commit's time: same checkout,
    same timestamps."""
    if pinned is not None:
        return pinned
    out = subprocess.run(
        ["git", "-C", str(repo), "log", "-1", "--format=%ct"], capture_output=True, text=True, check=False
    )
    return int(out.stdout.strip()) if out.stdout.strip().isdigit() else 1700000000


def _nvme_esp(base: Path, work: Path, epoch: int) -> Path:
    """The ESP the installer writes to the first NVMe drive. Its only boot application is a small UKI (same
    kernel, a busybox initramfs) that prints "the USB boot drive is missing" on every console: the real UKI
    and the bundle live on the USB drive only, so a node started without it stops with a clear message."""
    files = work / "nvme-esp"
    files.mkdir()
    kver = initramfs.kernel_version(base)
    (files / "cmdline").write_text("console=tty0 console=ttyS0,115200 quiet panic=0")
    (files / "os-release").write_text(node_files.os_release(VERSION))
    parts = uki.UkiParts(
        kernel=base / "boot" / f"vmlinuz-{kver}",
        initrd=initramfs.build_missing_usb(base, files / "initrd", epoch),
        cmdline=files / "cmdline",
        osrel=files / "os-release",
    )
    app = uki.build(parts, files / "BOOTX64.EFI", epoch)
    return disk.make_esp(
        work / "nvme-esp.img", 32 * MiB, {"EFI/BOOT/BOOTX64.EFI": app}, IDS["nvme_esp_volume_id"], epoch
    )


def _copy_pinned(src: Path, dst: Path) -> Path:
    shutil.copyfile(src, dst)
    return dst


def stage_tree(base: Path, work: Path, whl: Path, deps: Path, epoch: int, collections: Path) -> Path:
    stage = work / "stage"
    staging.link_tree(base, stage)
    wheel.unpack_node_packages(whl, stage / "usr/lib/python3/dist-packages")
    wheel.unpack_dependencies(deps, stage / wheel.NODE_SITE)
    stage_ansible(stage, collections)
    for rel, (text, mode) in node_files.files(VERSION).items():
        staging.put(stage, rel, text, mode)
    for rel, target in node_files.enable_links().items():
        staging.link(stage, rel, target)
    for rel in node_files.DISABLED_LINKS:
        (stage / rel.lstrip("/")).unlink(missing_ok=True)
    for d in node_files.DIRS:
        (stage / d.lstrip("/")).mkdir(parents=True, exist_ok=True)
    bytecode.compile_tree(stage)  # last of the Python: nothing can write a __pycache__ on the node
    staging.put(stage, "/usr/share/rigbase/nvme-esp.img", _nvme_esp(base, work, epoch).read_bytes())
    # The UKI carries kernel and initramfs; the root does not need copies of them.
    for p in sorted((stage / "boot").glob("*")):
        if p.is_file():
            p.unlink()
    return stage


def stage_ansible(stage: Path, collections: Path) -> None:
    """The node's local finalize: `ansible-playbook` and friends, and the collections."""
    scripts = {**node_ansible.console_scripts(stage / wheel.NODE_SITE), **node_ansible.module_python()}
    for name, text in scripts.items():
        staging.put(stage, f"{node_ansible.NODE_BIN}/{name}", text, 0o755)
    for rel, src in node_ansible.collection_files(collections).items():
        mode = 0o755 if src.stat().st_mode & 0o111 else 0o644
        staging.put(stage, f"{node_ansible.NODE_COLLECTIONS}/{rel}", src.read_bytes(), mode)


def build(cfg: BuildConfig, log: Callable[[str], None] = print) -> dict[str, Any]:  # noqa: PLR0915
    """Build the image; returns the manifest dict (also written, signed, to cfg.output)."""
    bundle_raw, bundle = read_bundle(cfg.bundle)
    key = manifest.load_private_key(cfg.key)
    epoch = cfg.source_date_epoch
    t = Timings()
    inputs = rootfs.inputs_for(cfg.with_nvidia, cfg.mirror)
    collections = node_ansible.host_collections()
    node_ansible.collection_files(collections)  # a missing collection fails before the minutes of work
    cfg.cache.mkdir(parents=True, exist_ok=True)
    cfg.output.parent.mkdir(parents=True, exist_ok=True)
    out = Path(tempfile.mkdtemp(prefix=f".{cfg.output.name}.", dir=cfg.output.parent))
    work = Path(tempfile.mkdtemp(prefix="work.", dir=cfg.cache))
    try:
        base = t.run("base", lambda: rootfs.base_tree(cfg.cache, inputs, log), log)
        whl = t.run("wheel", lambda: wheel.build_wheel(cfg.repo, work / "wheel", epoch), log)
        deps = t.run("deps", lambda: wheel.dependency_wheelhouse(cfg.cache, log), log)
        stage = t.run("stage", lambda: stage_tree(base, work, whl, deps, epoch, collections), log)
        root_img = t.run(
            "rootfs",
            lambda: ext4.make(stage, work / "root.ext4", IDS["root_fs_uuid"], "rigbase-root", epoch),
            log,
        )
        ver = t.run("verity", lambda: verity.format_hash(root_img, work / "root.verity"), log)
        initrd = t.run("initramfs", lambda: initramfs.build(base, work / "initrd.cpio", epoch), log)
        kver = initramfs.kernel_version(base)
        cmdline = f"{CMDLINE} rigbase.roothash={ver.root_hash}"
        parts = uki.UkiParts(
            kernel=base / "boot" / f"vmlinuz-{kver}",
            initrd=initrd,
            cmdline=work / "cmdline",
            osrel=work / "os-release",
        )
        parts.cmdline.write_text(cmdline)
        parts.osrel.write_text(node_files.os_release(VERSION))
        uki_path = t.run("uki", lambda: uki.build(parts, out / UKI_NAME, epoch), log)
        esp_files = {
            "EFI/BOOT/BOOTX64.EFI": _copy_pinned(uki.SYSTEMD_BOOT, work / "BOOTX64.EFI"),
            "EFI/Linux/rigbase.efi": uki_path,
            "loader/loader.conf": work / "loader.conf",
            node_files.BUNDLE_ON_ESP: work / "bundle.json",
        }
        (work / "loader.conf").write_text("timeout 0\ndefault rigbase.efi\neditor no\n")
        (work / "bundle.json").write_bytes(bundle_raw)
        esp_size = disk.mib(uki_path.stat().st_size + 8 * MiB)
        esp_size = max(esp_size, 40 * MiB)
        esp_img = t.run(
            "esp",
            lambda: disk.make_esp(work / "esp.img", esp_size, esp_files, IDS["esp_volume_id"], epoch),
            log,
        )
        layout = disk.Layout(
            IDS["disk_guid"],
            (
                disk.Partition(ESP_NAME, disk.ESP_TYPE, IDS["esp_partuuid"], esp_img, esp_size),
                disk.Partition(
                    initramfs.USB_ROOT,
                    disk.ROOT_TYPE,
                    IDS["root_partuuid"],
                    root_img,
                    disk.mib(root_img.stat().st_size),
                ),
                disk.Partition(
                    initramfs.USB_VERITY,
                    disk.VERITY_TYPE,
                    IDS["verity_partuuid"],
                    ver.hash_path,
                    disk.mib(ver.hash_path.stat().st_size),
                ),
            ),
        )
        image = t.run("disk", lambda: disk.write_image(layout, out / IMAGE_NAME), log)
        gce_disk = None
        if "gce" in cfg.targets:
            # the same ESP files but the bundle: a VM reads its bundle from the metadata server
            gce_files = {k: v for k, v in esp_files.items() if k != node_files.BUNDLE_ON_ESP}

            def _gce() -> gce.GceDisk:
                gce_esp = disk.make_esp(
                    work / "gce-esp.img", esp_size, gce_files, IDS["gce_esp_volume_id"], epoch
                )
                return gce.build(work, out, gce_esp, esp_size, root_img, ver.hash_path, epoch, sha256_file)

            gce_disk = t.run("gce", _gce, log)
        doc = t.run(
            "measure",
            lambda: _manifest(
                cfg,
                inputs,
                base,
                stage,
                whl,
                deps,
                bundle_raw,
                bundle,
                parts,
                uki_path,
                image,
                layout,
                ver,
                kver,
                cmdline,
                epoch,
                gce_disk,
            ),
            log,
        )
        raw = manifest.canonical(doc)
        (out / MANIFEST_NAME).write_bytes(raw)
        (out / (MANIFEST_NAME + manifest.SIGNATURE_SUFFIX)).write_bytes(manifest.sign(raw, key))
        from cryptography.hazmat.primitives import serialization

        (out / "builder.pub").write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        if cfg.output.exists():
            shutil.rmtree(cfg.output)
        out.rename(cfg.output)
        doc["_timings"] = t.steps
        return doc
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _partitions(layout: disk.Layout) -> dict[str, Any]:
    return {
        p.name: {"offset": off, "size": size, "partuuid": p.uuid}
        for p, (off, size) in zip(layout.partitions, disk.partition_offsets(layout).values(), strict=True)
    }


def _manifest(
    cfg: BuildConfig,
    inputs: rootfs.RootfsInputs,
    base: Path,
    stage: Path,
    whl: Path,
    deps: Path,
    bundle_raw: bytes,
    bundle: dict[str, Any],
    parts: uki.UkiParts,
    uki_path: Path,
    image: Path,
    layout: disk.Layout,
    ver: verity.Verity,
    kver: str,
    cmdline: str,
    epoch: int,
    gce_disk: gce.GceDisk | None = None,
) -> dict[str, Any]:
    sections = {
        ".linux": parts.kernel,
        ".osrel": parts.osrel,
        ".cmdline": parts.cmdline,
        ".initrd": parts.initrd,
    }
    pcr11 = measure.pcr11(sections)
    pe_hashes = {
        "systemd-boot": pe.authenticode_sha256(uki.SYSTEMD_BOOT.read_bytes()),
        "uki": pe.authenticode_sha256(uki_path.read_bytes()),
        "kernel": pe.authenticode_sha256(parts.kernel.read_bytes()),
    }
    packages = [
        dict(zip(("name", "version"), line.split(" ", 1), strict=False))
        for line in rootfs.installed_packages(base).splitlines()
        if line
    ]
    from cryptography.hazmat.primitives import serialization

    pub = (
        manifest.load_private_key(cfg.key)
        .public_key()
        .public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    )
    image_section = {
        "file": IMAGE_NAME,
        "sha256": sha256_file(image),
        "size": image.stat().st_size,
        "partitions": _partitions(layout),
    }
    targets: dict[str, Any] = {
        "usb": {**image_section, "pcr4": measure.pcr4_for_path([pe_hashes[n] for n in USB_BOOT_PATH])}
    }
    if gce_disk is not None:
        targets["gce"] = {
            "file": gce_disk.archive.name,
            "sha256": sha256_file(gce_disk.archive),
            "size": gce_disk.archive.stat().st_size,
            "disk_raw": {"sha256": gce_disk.raw_sha256, "size": gce_disk.raw_size},
            "disk_size_gb": gce_disk.raw_size // gce.GiB,
            "partitions": _partitions(gce_disk.layout),
            "boot_path": list(gce.GCE_BOOT_PATH),
            "pcr4": measure.pcr4_for_path([pe_hashes[n] for n in gce.GCE_BOOT_PATH]),
        }
    return {
        "schema": manifest.SCHEMA,
        "builder": {"version": BUILDER_VERSION, "key_sha256": hashlib.sha256(pub).hexdigest()},
        "image": image_section,
        "targets": targets,
        "uki": {"file": UKI_NAME, "sha256": sha256_file(uki_path), "size": uki_path.stat().st_size},
        "kernel": {"version": kver, "cmdline": cmdline},
        "verity": {"root_hash": ver.root_hash, "salt": verity.SALT, "data_blocks": ver.data_blocks},
        "pe_hashes": pe_hashes,
        "pcr4": {
            "boot_path": list(USB_BOOT_PATH),
            "sha256": measure.pcr4_for_path([pe_hashes[n] for n in USB_BOOT_PATH]),
        },
        "pcr11": [{"phase": phase, "sha256": value} for phase, value in pcr11.items()],
        "pcr12": {"sha256": measure.pcr12(cmdline)},
        "region": {
            "name": bundle["region"],
            "region_id": bundle["region_id"],
            "provider": bundle["provider"],
            "control_plane_url": bundle["control_plane_url"],
            "bundle_sha256": hashlib.sha256(bundle_raw).hexdigest(),
        },
        "packages": packages,
        **({"nvidia": driver.manifest()} if (driver := nvidia.facts_of(base)) else {}),
        "inputs": {
            "suite": inputs.suite,
            "mirror": inputs.mirror,
            "packages": list(inputs.packages),
            "components": list(inputs.components),
            "with_nvidia": inputs.with_nvidia,
            "nvidia_driver": inputs.nvidia_driver,
            "rootfs_key": inputs.key(),
            "source_date_epoch": epoch,
            "wheel": {"file": whl.name, "sha256": sha256_file(whl)},
            "python_requirements": wheel.pinned_requirements(),
            "python_wheels": {p.name: sha256_file(p) for p in sorted(deps.glob("*.whl"))},
            "ansible_collections": {
                "versions": node_ansible.collection_versions(node_ansible.host_collections()),
                "sha256": node_ansible.files_digest(
                    node_ansible.collection_files(node_ansible.host_collections())
                ),
            },
            "source_sha256": wheel.source_digest(cfg.repo),
            "systemd_stub_sha256": sha256_file(uki.STUB),
            "systemd_boot_sha256": sha256_file(uki.SYSTEMD_BOOT),
        },
    }
