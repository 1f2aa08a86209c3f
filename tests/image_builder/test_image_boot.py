"""The image end to end: two builds from one cache are byte-identical; the GCE target carries the same UKI
and root; the read-only root carries the bytecode its Python needs; an installed copy of another build is
replaced. Negative: a flipped root byte is refused by verity; a modified UKI changes PCR 11. The USB boot
that installs to NVMe, reboots into the installed OS and shows the banner and the manifest's PCRs is the
first part of test_node_life_vm.py's node life (one install for both).

One QEMU at a time (shared 2-core hosts)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from contracts.finalize import MODULE_PYTHON
from image_builder import manifest, measure, pe, rootfs, vm
from image_builder.node_ansible import NODE_BIN
from image_builder.wheel import NODE_SITE
from tests.image_builder import measured

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

GiB = 2**30


def _copy_sparse(src: Path, dst: Path) -> Path:
    subprocess.run(["cp", "--sparse=always", str(src), str(dst)], check=True)
    return dst


def test_two_builds_from_one_cache_are_byte_identical_and_signed(built_image) -> None:
    a, b = built_image.out, built_image.again
    for name in (
        "rigbase-usb.img",
        "rigbase-gce.tar.gz",
        "rigbase.efi",
        "manifest.json",
        "manifest.json.sig",
    ):
        assert (a / name).read_bytes() == (b / name).read_bytes(), f"{name} differs between two builds"
    doc = manifest.verify(
        (a / "manifest.json").read_bytes(),
        (a / "manifest.json.sig").read_bytes(),
        built_image.key_pub.read_bytes(),
    )
    assert doc["verity"]["root_hash"] in doc["kernel"]["cmdline"]
    assert [p["phase"] for p in doc["pcr11"]] == list(measure.PHASES)
    assert "join_token" not in json.dumps(doc)  # the bundle's secret stays off the manifest
    assert any(p["name"] == "linux-image-amd64" for p in doc["packages"])
    names = {p["name"] for p in doc["packages"]}
    assert {"systemd-resolved", "parted", "mdadm", "nfs-kernel-server", "cifs-utils"} <= names
    assert not names & {"openssh-server", "dropbear", "dropbear-bin"}  # no SSH server on a node
    assert {"podman", "crun", "conmon", "catatonit", "containernetworking-plugins"} <= names  # jobs run here
    uki = (a / "rigbase.efi").read_bytes()
    assert doc["pe_hashes"]["uki"] == pe.authenticode_sha256(uki)
    # The second build reused the debootstrap stage: seconds, not minutes.
    assert built_image.timings["base"] < 5


def test_gce_target_boots_the_same_uki_and_root_without_a_bundle_and_the_manifest_signs_it(
    built_image, tmp_path: Path
) -> None:
    from tests.image_builder import gce_disk

    doc = built_image.manifest
    gce = doc["targets"]["gce"]
    assert doc["targets"]["usb"]["sha256"] == doc["image"]["sha256"]
    assert gce["pcr4"] == doc["targets"]["usb"]["pcr4"] == doc["pcr4"]["sha256"]  # same chain of PE images
    archive = built_image.out / gce["file"]
    assert gce["sha256"] == hashlib.sha256(archive.read_bytes()).hexdigest()
    raw = gce_disk.unpack(archive, tmp_path / "gce")
    assert raw.stat().st_size == gce["disk_size_gb"] * gce_disk.GiB == gce["disk_raw"]["size"]
    parts = {p["name"]: p for p in gce_disk.partitions(raw)}
    assert list(parts) == ["rigbase-esp", "rigbase-os-root", "rigbase-os-verity", "rigbase-state"]
    usb = built_image.out / "rigbase-usb.img"
    # the root and its verity tree are the USB image's, byte for byte: the same root hash, PCR 12
    for usb_name, gce_name in (
        ("rigbase-usb-root", "rigbase-os-root"),
        ("rigbase-usb-verity", "rigbase-os-verity"),
    ):
        u, g = doc["image"]["partitions"][usb_name], gce["partitions"][gce_name]
        with usb.open("rb") as fu, raw.open("rb") as fg:
            fu.seek(u["offset"])
            fg.seek(g["offset"])
            assert hashlib.sha256(fu.read(u["size"])).digest() == hashlib.sha256(fg.read(u["size"])).digest()
    esp = gce_disk.esp_files(raw, gce["partitions"]["rigbase-esp"]["offset"])
    assert "rigbase.efi" in esp and "BOOTX64.EFI" in esp
    assert "bundle.json" not in esp  # a VM reads its bundle from the metadata server
    extracted = tmp_path / "uki.efi"
    subprocess.run(
        [
            "mcopy",
            "-i",
            f"{raw}@@{gce['partitions']['rigbase-esp']['offset']}",
            "::/EFI/Linux/rigbase.efi",
            str(extracted),
        ],
        check=True,
        env={**os.environ, "MTOOLS_SKIP_CHECK": "1"},
    )
    assert extracted.read_bytes() == (built_image.out / "rigbase.efi").read_bytes()  # PCR 11 is the same


def test_nvidia_package_set_resolves(built_image) -> None:
    base = rootfs.base_tree(built_image.cache, rootfs.inputs_for(False))
    plan = rootfs.simulate_install(base, rootfs.NVIDIA_PACKAGES, rootfs.apt_mirror())
    installs = [line.split()[1] for line in plan.splitlines() if line.startswith("Inst ")]
    assert "nvidia-driver" in installs and "nvidia-kernel-dkms" in installs


def test_the_node_root_runs_the_container_stack_the_minion_calls(built_image) -> None:
    """What minion/jobs/podman.py execs is there and runs in the node's own tree: podman with crun as its
    OCI runtime and catatonit for --init."""
    base = rootfs.base_tree(built_image.cache, rootfs.inputs_for(False))
    runs = ((["podman", "--version"], "podman version"), (["catatonit", "--version"], "catatonit"))
    for argv, words in runs:
        out = rootfs.chroot(base, *argv)
        assert words in (out.stdout + out.stderr), (argv, out.stdout, out.stderr)
    # crun re-executes itself through /proc, which a plain chroot lacks: present and executable is what
    # can be checked here (the lab's job tests run the same crun on this host)
    for path in ("usr/bin/crun", "usr/bin/conmon", "usr/lib/cni/bridge", "usr/sbin/xtables-nft-multi"):
        assert os.access(base / path, os.X_OK), path


# Run in the built root, mounted read-only as on a node: import what the minion and its finalize import, and
# name every module that came from a .py without an unchecked hash-based pyc beside it (PEP 552 flags 0b01).
BYTECODE_PROBE = """
import importlib.util, json, sys
sys.path.insert(0, "/usr/lib/rigbase/python")
import minion.cli, ansible.cli.playbook, ansible_runner
missing, checked = [], 0
for name, mod in sorted(sys.modules.items()):
    spec = getattr(mod, "__spec__", None)
    if not (getattr(spec, "origin", None) or "").endswith(".py"):
        continue
    try:
        with open(spec.cached, "rb") as f:
            head = f.read(8)
    except OSError:
        missing.append(spec.origin)
        continue
    checked += 1
    if head[:4] != importlib.util.MAGIC_NUMBER or int.from_bytes(head[4:8], "little") != 0b01:
        missing.append(spec.origin + " (not an unchecked hash-based pyc)")
print(json.dumps({"checked": checked, "missing": missing}))
"""


def test_the_read_only_root_carries_bytecode_for_what_the_minion_and_ansible_import(
    built_image, tmp_path: Path
) -> None:
    """Python cannot write a __pycache__ on the verity root: without the image's pycs every minion start,
    play and Ansible module on a node compiles its imports from source (image_builder/bytecode.py)."""
    root = built_image.manifest["image"]["partitions"]["rigbase-usb-root"]
    mnt = tmp_path / "root"
    mnt.mkdir()
    opts = f"ro,loop,offset={root['offset']},sizelimit={root['size']}"
    subprocess.run(["mount", "-o", opts, str(built_image.out / "rigbase-usb.img"), str(mnt)], check=True)
    try:
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(mnt / "tmp")], check=True)  # ansible's temp
        try:
            env = {
                "HOME": "/tmp",
                "ANSIBLE_LOCAL_TEMP": "/tmp/ansible",
                "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            }
            out = subprocess.run(
                ["chroot", str(mnt), "/usr/bin/python3", "-c", BYTECODE_PROBE],
                env=env, capture_output=True, text=True, check=False,
            )  # fmt: skip
            # the node's module Python (minion/finalize/module_python.py) loads module_utils from there
            where = subprocess.run(
                ["chroot", str(mnt), f"{NODE_BIN}/{MODULE_PYTHON}"],
                input="import ansible.module_utils.basic as b; print(b.__file__)\n",
                env=env, capture_output=True, text=True, check=False,
            )  # fmt: skip
        finally:
            subprocess.run(["umount", str(mnt / "tmp")], check=True)
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
    assert out.returncode == 0, out.stderr[-2000:]
    found = json.loads(out.stdout)
    assert found["checked"] > 300 and found["missing"] == [], found["missing"][:20]
    assert where.returncode == 0, where.stderr[-2000:]
    assert where.stdout.strip() == f"/{NODE_SITE}/ansible/module_utils/basic.py"  # its pyc: checked above


def test_flipped_root_byte_is_refused_by_verity(built_image, lab_tpm, tmp_path: Path) -> None:
    image = _copy_sparse(built_image.out / "rigbase-usb.img", tmp_path / "flipped.img")
    root = built_image.manifest["image"]["partitions"]["rigbase-usb-root"]
    with image.open("r+b") as fh:
        fh.seek(root["offset"] + 1024 + 0x78)  # inside the ext4 superblock (volume name)
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0x01]))
    with vm.Machine(tmp_path / "vm", image, [], lab_tpm.state_dir) as m:
        m.wait_for(r"rigbase: verity refused the root filesystem", 300)
        assert "RIGBASE-PCR11=" not in m.text()


def test_an_installed_copy_of_another_build_boots_the_usb_root_and_asks(
    built_image, lab_tpm, tmp_path: Path
) -> None:
    """A node whose NVMe holds another build's OS (this USB drive is newer): `veritysetup open` of that
    copy succeeds (open only maps it), but its blocks fail this drive's root hash. The initramfs must boot
    the drive's own root, and the installer offers to replace the old build, instead of stopping at a
    verity refusal."""
    parts = built_image.manifest["image"]["partitions"]
    root, verity = parts["rigbase-usb-root"], parts["rigbase-usb-verity"]
    nvme = vm.blank_disk(tmp_path / "nvme0.img", 2 * GiB)
    layout = (
        "label: gpt\n"
        f"start=2048, size={root['size'] // 512}, name=rigbase-os-root\n"
        f"size={verity['size'] // 512}, name=rigbase-os-verity\n"
    )
    subprocess.run(["sfdisk", "-q", str(nvme)], input=layout, text=True, check=True)
    with (built_image.out / "rigbase-usb.img").open("rb") as usb, nvme.open("r+b") as disk:
        for part, start in ((root, 2048 * 512), (verity, 2048 * 512 + root["size"])):
            usb.seek(part["offset"])
            disk.seek(start)
            left = part["size"]
            while left:
                chunk = usb.read(min(left, 2**24))
                disk.write(chunk)
                left -= len(chunk)
        # another build: the same layout, other bytes (inside the first block, the ext4 superblock)
        disk.seek(2048 * 512 + 1024 + 0x78)
        byte = disk.read(1)
        disk.seek(-1, os.SEEK_CUR)
        disk.write(bytes([byte[0] ^ 0x01]))
    with vm.Machine(tmp_path / "vm", built_image.out / "rigbase-usb.img", [nvme], lab_tpm.state_dir) as m:
        m.wait_for(r"hold a different rigbase build", 420)
        m.send("no\n")
        m.wait_for(r"aborted; nothing was written", 60)
        assert "verity refused" not in m.text()


def test_modified_uki_changes_pcr11_and_no_writes_nothing(built_image, lab_tpm, tmp_path: Path) -> None:
    doc = built_image.manifest
    image = _copy_sparse(built_image.out / "rigbase-usb.img", tmp_path / "modified.img")
    uki = bytearray((built_image.out / "rigbase.efi").read_bytes())
    osrel = pe.section(bytes(uki), ".osrel")
    at = bytes(uki).index(osrel) + osrel.index(b"rigbase node")
    uki[at : at + 12] = b"RIGBASE NODE"  # same length: only the measured .osrel content changes
    (tmp_path / "rigbase.efi").write_bytes(bytes(uki))
    esp = doc["image"]["partitions"]["rigbase-esp"]["offset"]
    subprocess.run(
        ["mcopy", "-o", "-i", f"{image}@@{esp}", str(tmp_path / "rigbase.efi"), "::/EFI/Linux/rigbase.efi"],
        check=True,
        env={**os.environ, "MTOOLS_SKIP_CHECK": "1"},
    )
    sections = {n: pe.section(bytes(uki), n) for n in (".linux", ".osrel", ".cmdline", ".initrd")}
    nvme = vm.blank_disk(tmp_path / "nvme0.img", 2 * GiB)
    with vm.Machine(tmp_path / "vm", image, [nvme], lab_tpm.state_dir) as m:
        m.wait_for(r"Type 'yes' to ERASE", 420)
        m.send("no\n")
        m.wait_for(r"aborted; nothing was written", 60)
        m.wait_for(measured.EVENTLOG_LINE, 300)
        pcrs = measured.pcrs(m.text())
    expected = {p["phase"]: p["sha256"] for p in doc["pcr11"]}["sysinit:ready"]
    assert pcrs[11] != expected
    assert pcrs[11] == measure.pcr11_python(sections, "sysinit:ready")
    with nvme.open("rb") as fh:
        assert fh.read(4 * 2**20) == b"\0" * (4 * 2**20)  # 'no' wrote nothing, not even a partition table
