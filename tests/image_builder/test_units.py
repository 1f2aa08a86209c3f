"""Fast tests of the image builder's parts, each against the real tool it drives (mkfs.ext4, sfdisk,
veritysetup, mtools, objcopy, systemd-measure) on small inputs. The full build and QEMU boot are in
test_image_boot.py."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from image_builder import (
    build,
    cpio,
    disk,
    ext4,
    installer,
    manifest,
    measure,
    node_ansible,
    node_files,
    pe,
    rootfs,
    uki,
    verity,
    vm,
    wheel,
)
from image_builder.errors import BuildError
from image_builder.plan import IDS, STEPS, fixed_uuid

EPOCH = 1700000000


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The installed `image-builder` command (pyproject.toml's console script), as an operator runs it."""
    return subprocess.run(
        [str(Path(sys.executable).parent / "image-builder"), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        check=False,
    )


# --- manifest signing -------------------------------------------------------------------------------


def test_keygen_writes_private_key_0600_and_refuses_to_overwrite(tmp_path: Path) -> None:
    priv, pub = manifest.keygen(tmp_path / "k.pem")
    assert stat.S_IMODE(priv.stat().st_mode) == 0o600
    assert b"BEGIN PUBLIC KEY" in pub.read_bytes()
    with pytest.raises(manifest.ManifestError, match="--force"):
        manifest.keygen(tmp_path / "k.pem")
    r = _cli("keygen", "--key", str(tmp_path / "k.pem"))
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "--force" in r.stderr


def test_verify_accepts_the_signed_bytes_and_refuses_any_change(tmp_path: Path) -> None:
    priv, pub = manifest.keygen(tmp_path / "k.pem")
    doc = {"schema": manifest.SCHEMA, "image": {"sha256": "ab" * 32}}
    raw = manifest.canonical(doc)
    sig = manifest.sign(raw, manifest.load_private_key(priv))
    assert manifest.verify(raw, sig, pub.read_bytes()) == doc
    assert manifest.verify(raw, base64.b64decode(sig), pub.read_bytes()) == doc  # raw 64-byte form too
    tampered = raw.replace(b"abab", b"abac", 1)
    with pytest.raises(manifest.ManifestError, match="altered"):
        manifest.verify(tampered, sig, pub.read_bytes())
    _other_priv, other_pub = manifest.keygen(tmp_path / "other.pem")
    with pytest.raises(manifest.ManifestError, match="another builder"):
        manifest.verify(raw, sig, other_pub.read_bytes())


def test_cli_usage_errors_exit_2_and_bad_bundle_exits_1_without_output(tmp_path: Path) -> None:
    assert _cli("build").returncode == 2
    bad = tmp_path / "bundle.json"
    manifest.keygen(tmp_path / "k.pem")
    for text in ("{not json", "42", '{"version": 1}'):  # not JSON, JSON but not an object, fields missing
        bad.write_text(text)
        r = _cli(
            "build",
            "--bundle",
            str(bad),
            "--output",
            str(tmp_path / "out"),
            "--cache",
            str(tmp_path / "c"),
            "--key",
            str(tmp_path / "k.pem"),
        )
        assert r.returncode == 1, r.stderr
        assert "provision region bundle" in r.stderr and r.stderr.count("\n") == 1
        assert not (tmp_path / "out").exists()


def test_plan_is_plain_data_with_fixed_identifiers(tmp_path: Path) -> None:
    b = tmp_path / "b.json"
    b.write_text("{}")
    r = _cli("build", "--bundle", str(b), "--output", str(tmp_path / "o"), "--plan")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert [s["name"] for s in plan["steps"]] == [s.name for s in STEPS]
    assert plan["ids"] == IDS
    # Pinned literally: a changed namespace or name would silently change every image's GPT and root UUIDs.
    assert fixed_uuid("disk") == "31000628-d994-50eb-884d-7f0e4198c9ee"
    assert IDS["root_fs_uuid"] == "2e6af87e-35a2-51fb-833f-2a9b2515cb19"


# --- filesystems and disk ---------------------------------------------------------------------------


def _small_tree(root: Path) -> Path:
    for i in range(40):
        d = root / f"dir{i % 5}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"file{i}").write_bytes(f"content {i}\n".encode() * (i + 1))
    (root / "link").symlink_to("dir0/file0")
    return root


def test_ext4_image_is_byte_identical_for_the_same_tree_built_at_different_times(tmp_path: Path) -> None:
    tree = _small_tree(tmp_path / "tree")
    a = ext4.make(tree, tmp_path / "a.ext4", IDS["root_fs_uuid"], "t", EPOCH)
    os.utime(tree / "dir1" / "file1", (EPOCH + 5, EPOCH + 5))  # host times must not leak into the image
    (tree / "dir2" / "file2").chmod(0o644)  # bumps ctime
    b = ext4.make(tree, tmp_path / "b.ext4", IDS["root_fs_uuid"], "t", EPOCH)
    assert a.read_bytes() == b.read_bytes()
    out = subprocess.run(
        ["debugfs", "-R", "stat /dir1/file1", str(a)], capture_output=True, text=True, check=True
    ).stdout
    assert "0x6553f100" in out  # EPOCH in hex: ctime/atime/mtime pinned
    assert subprocess.run(["e2fsck", "-fn", str(a)], capture_output=True).returncode == 0


def test_verity_root_hash_is_stable_and_detects_one_flipped_byte(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.write_bytes(os.urandom(4096 * 64))
    v1 = verity.format_hash(data, tmp_path / "h1")
    v2 = verity.format_hash(data, tmp_path / "h2")
    assert v1.root_hash == v2.root_hash and (tmp_path / "h1").read_bytes() == (tmp_path / "h2").read_bytes()
    assert verity.verify(data, v1.hash_path, v1.root_hash)
    raw = bytearray(data.read_bytes())
    raw[4096 * 10 + 7] ^= 0x01
    data.write_bytes(bytes(raw))
    assert not verity.verify(data, v1.hash_path, v1.root_hash)


def test_disk_image_has_fixed_gpt_ids_and_partition_contents(tmp_path: Path) -> None:
    payload = tmp_path / "p.img"
    payload.write_bytes(b"rigbase" * 1000)
    esp = disk.make_esp(
        tmp_path / "esp.img", 40 * disk.MiB, {"EFI/BOOT/BOOTX64.EFI": payload}, "12345678", EPOCH
    )
    layout = disk.Layout(
        IDS["disk_guid"],
        (
            disk.Partition("rigbase-esp", disk.ESP_TYPE, IDS["esp_partuuid"], esp, 40 * disk.MiB),
            disk.Partition("rigbase-usb-root", disk.ROOT_TYPE, IDS["root_partuuid"], payload, disk.MiB),
        ),
    )
    a = disk.write_image(layout, tmp_path / "a.img")
    table = json.loads(
        subprocess.run(["sfdisk", "--json", str(a)], capture_output=True, text=True, check=True).stdout
    )
    parts = table["partitiontable"]["partitions"]
    assert table["partitiontable"]["id"].lower() == IDS["disk_guid"]
    assert [p["name"] for p in parts] == ["rigbase-esp", "rigbase-usb-root"]
    assert parts[1]["uuid"].lower() == IDS["root_partuuid"]
    off, _size = disk.partition_offsets(layout)["rigbase-usb-root"]
    with a.open("rb") as fh:
        fh.seek(off)
        assert fh.read(payload.stat().st_size) == payload.read_bytes()
    listing = subprocess.run(
        ["mdir", "-i", f"{a}@@{disk.MiB}", "::/EFI/BOOT"],
        capture_output=True,
        text=True,
        env={**os.environ, "MTOOLS_SKIP_CHECK": "1"},
        check=True,
    ).stdout
    assert "BOOTX64" in listing
    b = disk.write_image(layout, tmp_path / "b.img")
    assert a.read_bytes() == b.read_bytes()


def test_cpio_archive_is_readable_by_cpio_and_deterministic(tmp_path: Path) -> None:
    entries = [
        cpio.Entry("bin", stat.S_IFDIR | 0o755),
        cpio.Entry("bin/x", stat.S_IFREG | 0o755, b"hello"),
        cpio.Entry("bin/y", stat.S_IFLNK | 0o777, b"x"),
    ]
    a = cpio.archive(entries, EPOCH)
    assert a == cpio.archive(list(reversed(entries)), EPOCH)
    got = _read_newc(a)
    assert [(n, m) for n, m, _ in got] == [
        ("bin", stat.S_IFDIR | 0o755),
        ("bin/x", stat.S_IFREG | 0o755),
        ("bin/y", stat.S_IFLNK | 0o777),
    ]
    assert got[1][2] == b"hello" and got[2][2] == b"x"


def _read_newc(blob: bytes) -> list[tuple[str, int, bytes]]:
    """An independent reader of the newc format (the kernel's initramfs unpacker reads the same layout)."""
    out: list[tuple[str, int, bytes]] = []
    off = 0
    while True:
        assert blob[off : off + 6] == b"070701"
        f = [int(blob[off + 6 + 8 * i : off + 14 + 8 * i], 16) for i in range(13)]
        mode, size, namesize = f[1], f[6], f[11]
        name = blob[off + 110 : off + 110 + namesize - 1].decode()
        off = (off + 110 + namesize + 3) & ~3
        data = blob[off : off + size]
        off = (off + size + 3) & ~3
        if name == "TRAILER!!!":
            return out
        assert f[5] == EPOCH
        out.append((name, mode, data))


# --- UKI and measurements ---------------------------------------------------------------------------


def _uki(tmp_path: Path, osrel: bytes = b"ID=rigbase\n") -> tuple[Path, dict[str, Path]]:
    files = {
        ".linux": tmp_path / "vmlinuz",
        ".osrel": tmp_path / "osrel",
        ".cmdline": tmp_path / "cmdline",
        ".initrd": tmp_path / "initrd",
    }
    files[".linux"].write_bytes(uki.SYSTEMD_BOOT.read_bytes())  # any PE stands in for a kernel here
    files[".osrel"].write_bytes(osrel)
    files[".cmdline"].write_bytes(b"console=ttyS0 rigbase.roothash=" + b"ab" * 32)
    files[".initrd"].write_bytes(b"\x1f\x8b" + b"x" * 5000)
    out = uki.build(
        uki.UkiParts(files[".linux"], files[".initrd"], files[".cmdline"], files[".osrel"]),
        tmp_path / "uki.efi",
        EPOCH,
    )
    return out, files


def test_uki_is_reproducible_and_its_pcr11_matches_systemd_measure(tmp_path: Path) -> None:
    a, files = _uki(tmp_path)
    first = a.read_bytes()
    b, _ = _uki(tmp_path)
    assert b.read_bytes() == first
    assert struct.unpack_from("<I", first, pe.parse(first).pe_offset + 8)[0] == EPOCH
    sections = {n: pe.section(first, n) for n in (".linux", ".osrel", ".cmdline", ".initrd")}
    assert sections[".cmdline"] == files[".cmdline"].read_bytes()
    predicted = measure.pcr11(files)
    for phase, value in predicted.items():
        assert measure.pcr11_python(sections, phase) == value
    assert len(set(predicted.values())) == len(measure.PHASES)
    (tmp_path / "altered").mkdir()
    c, _ = _uki(tmp_path / "altered", osrel=b"ID=rigbasf\n")
    altered = {n: pe.section(c.read_bytes(), n) for n in sections}
    assert measure.pcr11_python(altered, "sysinit:ready") != predicted["sysinit:ready"]


def test_authenticode_digest_ignores_checksum_and_covers_sections() -> None:
    data = bytearray(uki.SYSTEMD_BOOT.read_bytes())
    digest = pe.authenticode_sha256(bytes(data))
    h = pe.parse(bytes(data))
    struct.pack_into("<I", data, h.checksum_offset, 0x1234)
    assert pe.authenticode_sha256(bytes(data)) == digest
    name, _va, _vs, ptr, _size = h.sections[0]
    data[ptr + 10] ^= 0xFF
    assert pe.authenticode_sha256(bytes(data)) != digest


def _event_log(events: list[tuple[int, int, bytes, bytes]]) -> bytes:
    spec = (
        b"Spec ID Event03\0" + struct.pack("<IBBBBI", 0, 0, 2, 0, 2, 1) + struct.pack("<HH", 0x0B, 32) + b"\0"
    )
    out = struct.pack("<II", 0, 3) + b"\0" * 20 + struct.pack("<I", len(spec)) + spec
    for pcr, etype, digest, data in events:
        out += (
            struct.pack("<III", pcr, etype, 1)
            + struct.pack("<H", 0x0B)
            + digest
            + struct.pack("<I", len(data))
            + data
        )
    return out


def test_pcr4_replay_accepts_the_manifest_path_and_rejects_an_unknown_image() -> None:
    known = {"systemd-boot": "11" * 32, "uki": "22" * 32, "kernel": "33" * 32}
    events = [
        (4, measure.EV_EFI_ACTION, hashlib.sha256(measure.CALLING_EFI_APP).digest(), measure.CALLING_EFI_APP),
        (4, measure.EV_SEPARATOR, hashlib.sha256(b"\0" * 4).digest(), b"\0" * 4),
        (0, measure.EV_NO_ACTION, b"\0" * 32, b"ignored"),
        *[(4, measure.EV_EFI_BOOT_SERVICES_APPLICATION, bytes.fromhex(known[n]), b"") for n in known],
    ]
    log = measure.parse_event_log(_event_log(events))
    expected = measure.pcr4_for_path(list(known.values()))
    ok = measure.check_pcr4(log, expected, known)
    assert ok.ok and ok.loaded_images == ["systemd-boot", "uki", "kernel"]
    assert not measure.check_pcr4(log, "00" * 32, known).ok  # log does not replay to the quoted value
    other = dict(known, uki="44" * 32)
    bad = measure.check_pcr4(log, expected, other)
    assert not bad.ok and "not in the manifest" in bad.reason


def test_pcr12_is_the_command_line_measured_by_boot_loader_and_stub() -> None:
    c = "console=ttyS0 rigbase.roothash=" + "ab" * 32
    d = hashlib.sha256(c.encode("utf-16-le") + b"\0\0").digest()
    once = hashlib.sha256(b"\0" * 32 + d).digest()
    assert measure.pcr12(c) == hashlib.sha256(once + d).hexdigest()
    assert measure.pcr12(c + " init=/bin/sh") != measure.pcr12(c)


# --- installer decisions ----------------------------------------------------------------------------


def test_installer_decisions_are_a_table() -> None:
    p = [installer.BlockPart("/dev/nvme0n1p2", "nvme0n1", installer.OS_ROOT)]
    assert installer.situation("nvme", ["nvme0n1"], p) is installer.Situation.BOOTED_FROM_NVME
    assert installer.situation("usb", [], []) is installer.Situation.NO_NVME
    assert installer.situation("usb", ["nvme0n1"], []) is installer.Situation.BLANK
    assert installer.situation("usb", ["nvme0n1"], p) is installer.Situation.OTHER_BUILD
    assert set(installer.ACTIONS) == set(installer.Situation)
    assert all(s in installer.PROMPTS for s, a in installer.ACTIONS.items() if a == "ask")


def test_installer_layout_is_accepted_by_sfdisk(tmp_path: Path) -> None:
    scripts = installer.layout_scripts(["nvme0n1", "nvme1n1"], 800 * disk.MiB, 8 * disk.MiB)
    for name, script in scripts.items():
        img = tmp_path / f"{name}.img"
        with img.open("wb") as fh:
            fh.truncate(2 * 2**30)
        subprocess.run(["sfdisk", "-q", str(img)], input=script, text=True, check=True)
        parts = json.loads(
            subprocess.run(["sfdisk", "--json", str(img)], capture_output=True, text=True, check=True).stdout
        )["partitiontable"]["partitions"]
        names = [p["name"] for p in parts]
        if name == "nvme0n1":
            assert names == [
                installer.OS_ESP,
                installer.OS_ROOT,
                installer.OS_VERITY,
                installer.OS_STATE + "-new",
            ]
            assert parts[1]["size"] * 512 == 800 * disk.MiB
        else:
            assert names == ["rigbase-data-1"]


# --- node files: units, resolver, local finalize ------------------------------------------------------


def _unit(text: str) -> dict[str, list[str]]:
    """`Key` → every value it is given (systemd allows repeats), across sections; continuations joined."""
    out: dict[str, list[str]] = {}
    for line in text.replace("\\\n", " ").splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key.strip(), []).append(" ".join(value.split()))
    return out


def test_node_config_unit_reapplies_saved_finalize_before_the_minion_without_blocking_it() -> None:
    config = _unit(node_files.UNITS["rigbase-node-config.service"])
    # The minion's own state directory (`minion run`'s default), where finalize saves what it applied.
    assert config["ExecStart"] == [
        "/usr/local/bin/minion finalize apply-saved --state-dir /var/lib/rigbase/minion"
    ]
    assert config["Type"] == ["oneshot"] and "local-fs.target" in config["After"][0]
    assert config["RequiresMountsFor"] == ["/var/lib/rigbase"]
    assert config["Before"] == ["rigbase-minion.service"]
    minion = _unit(node_files.UNITS["rigbase-minion.service"])
    assert "rigbase-node-config.service" in minion["After"][0]
    # Ordering only: a failed re-apply must not keep the minion from starting.
    assert not any(
        "rigbase-node-config" in v for k in ("Requires", "Wants", "BindsTo") for v in minion.get(k, [])
    )
    assert "--authorized-keys" not in node_files.UNITS["rigbase-minion.service"]
    for unit in (config, minion):
        env = " ".join(unit["Environment"])
        assert f"RIGBASE_ANSIBLE_COLLECTIONS={node_ansible.NODE_COLLECTIONS}" in env and "LANG=C.UTF-8" in env
    links = node_files.enable_links()
    assert "/etc/systemd/system/multi-user.target.wants/rigbase-node-config.service" in links


def test_resolver_is_resolved_fed_by_dhcp_and_resolv_conf_is_its_stub() -> None:
    links = node_files.enable_links()
    assert links["/etc/resolv.conf"] == "/run/systemd/resolve/stub-resolv.conf"
    assert "/etc/resolv.conf" not in node_files.files(
        "0"
    )  # a link, not a file with the build host's resolver
    assert "/etc/systemd/system/sysinit.target.wants/systemd-resolved.service" in links
    # Nothing listens on the network before finalize asks for it.
    assert "/etc/systemd/system/sockets.target.wants/rpcbind.socket" in node_files.DISABLED_LINKS
    assert not set(node_files.DISABLED_LINKS) & set(links)
    assert "DHCP=yes" in node_files.DHCP_NETWORK
    # network-online is bounded: a node without a link boots on.
    wait = _unit(node_files.WAIT_ONLINE_DROPIN)["ExecStart"]
    assert wait[0] == "" and "--timeout=20" in wait[1] and "--any" in wait[1]
    assert {"systemd-resolved", "parted", "mdadm", "nfs-kernel-server"} <= set(rootfs.BASE_PACKAGES)
    assert not any("ssh" in p for p in rootfs.BASE_PACKAGES)


def test_ansible_console_script_launchers_run_with_the_pinned_wheels(tmp_path: Path) -> None:
    from importlib.metadata import distribution

    site = Path(str(distribution("ansible-core").locate_file("")))
    scripts = node_ansible.console_scripts(site)
    assert {"ansible-playbook", "ansible-runner"} <= set(scripts)
    for name in ("ansible-playbook", "ansible-runner"):
        path = tmp_path / name
        path.write_text(scripts[name])
        out = subprocess.run(
            [sys.executable, str(path), "--version"], capture_output=True, text=True, check=False
        )
        assert out.returncode == 0, out.stderr
    assert {"ansible-core", "ansible-runner", "Jinja2"} <= set(wheel.NODE_REQUIREMENTS)


def test_shipped_collections_come_from_the_venv_and_a_missing_one_is_a_one_line_error(tmp_path: Path) -> None:
    files = node_ansible.collection_files(node_ansible.host_collections())
    assert "ansible_collections/community/general/plugins/modules/parted.py" in files
    assert list(files) == sorted(files) and not any("__pycache__" in f for f in files)
    assert node_ansible.collection_versions(node_ansible.host_collections())["community.general"]
    with pytest.raises(BuildError, match="community.general is missing .* run scripts/install-deps.sh"):
        node_ansible.collection_files(tmp_path)


# --- QEMU helper ------------------------------------------------------------------------------------


def test_vm_command_line_defaults_to_no_network_and_adds_nic_and_sata_on_request(tmp_path: Path) -> None:
    for d in "abc":
        (tmp_path / d).mkdir()
    plain = vm.Machine(tmp_path / "a", None, [], tmp_path / "tpm").argv()
    assert plain[plain.index("-nic") + 1] == "none" and "ahci,id=ahci" not in plain
    sata = [tmp_path / f"s{i}.img" for i in range(3)]
    argv = vm.Machine(
        tmp_path / "b", None, [], tmp_path / "tpm", sata_images=sata, control_plane_port=18470
    ).argv()
    line = " ".join(argv)
    assert "-nic" not in argv
    assert "user,id=n0,restrict=on,guestfwd=tcp:10.0.2.100:8470-cmd:socat - TCP:127.0.0.1:18470" in argv
    assert "virtio-net-pci,netdev=n0,speed=10000,duplex=full" in argv
    assert "ide-hd,drive=sata2,bus=ahci.2,serial=rigbase-sata2" in line
    with pytest.raises(ValueError, match="at most 6 SATA drives"):
        vm.Machine(tmp_path / "c", None, [], tmp_path / "tpm", sata_images=sata * 3).argv()
    (tmp_path / "d").mkdir()
    gce = vm.Machine(
        tmp_path / "d",
        None,
        [],
        tmp_path / "tpm",
        control_plane_port=18470,
        gce_disk=tmp_path / "disk.raw",
        metadata_port=18080,
    ).argv()
    assert (
        "user,id=n0,restrict=on,net=169.254.169.0/24,"
        "guestfwd=tcp:169.254.169.100:8470-cmd:socat - TCP:127.0.0.1:18470,"
        "guestfwd=tcp:169.254.169.254:80-cmd:socat - TCP:127.0.0.1:18080"
    ) in gce
    assert "type=1,manufacturer=Google,product=Google Compute Engine" in gce
    assert "scsi-hd,drive=boot,bus=scsi.0,bootindex=0" in gce and "usb-storage" not in " ".join(gce)


def test_vm_monitor_resets_the_guest_and_keeps_its_drives(tmp_path: Path) -> None:
    """Real QEMU (TCG) and swtpm, firmware only: QEMU accepts the network and drive options, and the QMP
    monitor answers, resets, and still shows the same drives after the reset."""
    nvme = [vm.blank_disk(tmp_path / "n0.img", 2**20)]
    sata = [vm.blank_disk(tmp_path / f"s{i}.img", 2**20) for i in range(2)]
    (tmp_path / "tpm").mkdir()
    with vm.Machine(
        tmp_path / "vm", None, nvme, tmp_path / "tpm", sata_images=sata, control_plane_port=18470
    ) as m:
        assert m.qmp("query-status")["status"] == "running"
        before = sorted(b["device"] for b in m.qmp("query-block") if b.get("inserted"))
        m.system_reset()
        assert m.qmp("query-status")["status"] == "running"
        after = sorted(b["device"] for b in m.qmp("query-block") if b.get("inserted"))
        assert before == after and {"nvme0", "sata0", "sata1"} <= set(after)
        with pytest.raises(vm.MonitorError):
            m.qmp("no-such-command")


# --- the GCE target ---------------------------------------------------------------------------------


def test_gce_disk_is_one_whole_gib_disk_raw_with_the_installed_layout_and_its_state_grows(
    tmp_path: Path,
) -> None:
    from image_builder import gce
    from tests.image_builder import gce_disk

    payload = tmp_path / "BOOTX64.EFI"
    payload.write_bytes(b"rigbase" * 1000)
    esp = disk.make_esp(
        tmp_path / "esp.img", 40 * disk.MiB, {"EFI/BOOT/BOOTX64.EFI": payload}, "52494747", EPOCH
    )
    root = tmp_path / "root.img"
    root.write_bytes(os.urandom(3 * disk.MiB))
    tree = tmp_path / "verity.img"
    tree.write_bytes(os.urandom(disk.MiB // 2))
    made = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / f"work-{name}").mkdir()
        made.append(
            gce.build(
                tmp_path / f"work-{name}",
                tmp_path / name,
                esp,
                40 * disk.MiB,
                root,
                tree,
                EPOCH,
                build.sha256_file,
            )
        )
    a, b = made
    assert a.archive.read_bytes() == b.archive.read_bytes()  # reproducible: tar and gzip headers pinned
    assert not (tmp_path / "work-a" / "disk.raw").exists()  # only the archive is kept
    raw = gce_disk.unpack(a.archive, tmp_path / "unpacked")
    assert raw.stat().st_size == gce_disk.GiB == a.raw_size
    assert hashlib.sha256(raw.read_bytes()).hexdigest() == a.raw_sha256
    parts = gce_disk.partitions(raw)
    assert [p["name"] for p in parts] == [
        "rigbase-esp",
        "rigbase-os-root",
        "rigbase-os-verity",
        "rigbase-state",
    ]
    assert [p["uuid"].lower() for p in parts] == [
        IDS[k] for k in ("gce_esp_partuuid", "gce_root_partuuid", "gce_verity_partuuid", "gce_state_partuuid")
    ]
    offsets = disk.partition_offsets(a.layout)
    with raw.open("rb") as fh:
        fh.seek(offsets["rigbase-os-root"][0])
        assert fh.read(3 * disk.MiB) == root.read_bytes()
    assert "BOOTX64.EFI" in gce_disk.esp_files(raw, offsets["rigbase-esp"][0])
    state_off = offsets["rigbase-state"][0]
    with raw.open("rb") as fh:
        fh.seek(state_off)
        (tmp_path / "state.ext4").write_bytes(fh.read(gce.MIN_STATE))
    label = subprocess.run(
        ["e2label", str(tmp_path / "state.ext4")], capture_output=True, text=True, check=True
    )
    assert label.stdout.strip() == "rigbase-state"
    # the node writes it: journalled (a VM is stopped hard), MIN_STATE large until the first boot grows it
    header = subprocess.run(
        ["dumpe2fs", "-h", str(tmp_path / "state.ext4")], capture_output=True, text=True, check=True
    ).stdout
    features = next(ln for ln in header.splitlines() if ln.startswith("Filesystem features:"))
    assert "has_journal" in features.split(), features
    fields = dict(ln.split(":", 1) for ln in header.splitlines() if ":" in ln)
    assert int(fields["Block count"]) * int(fields["Block size"]) == gce.MIN_STATE
    subprocess.run(["e2fsck", "-fn", str(tmp_path / "state.ext4")], capture_output=True, check=True)
    # first boot on a 10 GB disk: the state partition ends at the disk's end, the others do not move
    script = tmp_path / "rigbase-grow-state"
    script.write_text(node_files.GROW_STATE_SCRIPT)
    last = gce_disk.grow(raw, 10 * gce_disk.GiB, script)
    assert last["name"] == "rigbase-state" and last["start"] * 512 == state_off
    assert (last["start"] + last["size"]) * 512 > 10 * gce_disk.GiB - 2 * disk.MiB
    assert [p["start"] for p in gce_disk.partitions(raw)[:3]] == [p["start"] for p in parts[:3]]


def test_gce_units_run_only_on_compute_engine_and_the_usb_minion_keeps_its_bundle() -> None:
    units = node_files.UNITS
    assert "ConditionPathExists=/boot/efi/rigbase/bundle.json" in units["rigbase-minion.service"]
    gce_minion = units["rigbase-minion-gce.service"]
    assert "--bundle /var/lib/rigbase/bundle.json" in gce_minion
    assert "Requires=rigbase-gce-bundle.service" in gce_minion and "After=" in gce_minion
    assert "ExecCondition=/bin/grep -qx 'Google Compute Engine'" in units["rigbase-gce-bundle.service"]
    assert "minion gce-bundle --output /var/lib/rigbase/bundle.json" in units["rigbase-gce-bundle.service"]
    grow = node_files.EARLY_UNITS["rigbase-grow-state.service"][0]
    assert "Before=var-lib-rigbase.mount" in grow and "DefaultDependencies=no" in grow
    assert "product_name || exit 0" in node_files.GROW_STATE_SCRIPT  # elsewhere it does nothing
    links = node_files.enable_links()
    assert "/etc/systemd/system/local-fs.target.wants/rigbase-grow-state.service" in links
