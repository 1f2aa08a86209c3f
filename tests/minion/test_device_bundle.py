"""The Jetson device bundle: `image-builder device-bundle` builds it,
its install.sh installs it into an arm64 Debian tree, and the installed aarch64 minion runs there under
qemu-user emulation: CPython 3.11 for aarch64 from Debian, the bundle's own aarch64 wheels.

What this proves on an x86 machine: the archive is complete, reproducible and aarch64-only; install.sh
refuses what it must (no Python 3.11, an x86 Python, a changed file) and lays out /opt/rigbase,
/etc/rigbase (bundle 0600, the identity choice) and the systemd unit; the installed minion recognises a
Xavier NX from its device tree, creates its device key and joins a real control plane (on loopback)
with it. What it does not prove: JetPack's own Ubuntu userland (20.04/22.04) and a real Jetson's kernel,
GPU and L4T — see docs/devices.md "What was tested"."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from provisioner.lab import hardware
from provisioner.lab.rootfs import apt_mirror
from tests.fixtures.control_plane import ControlPlane, start_control_plane
from tests.fixtures.rootfs import rootfs_cache_dir

IMAGE_BUILDER = Path(sys.executable).parent / "image-builder"
QEMU = shutil.which("qemu-aarch64-static")
# Debian's arm64 CPython 3.11 and what the minion loads through it (libudev for pyudev)
ARM64_PACKAGES = "python3.11-minimal,libpython3.11-stdlib,libudev1"
TIMEOUT_S = 300


@pytest.fixture(scope="module")
def arm64_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Debian bookworm arm64 tree with python3.11: debootstrap's first stage (download and unpack, no
    emulation), then every downloaded package unpacked without its scripts. Cached like the lab's root."""
    if QEMU is None or shutil.which("debootstrap") is None:
        pytest.fail("qemu-user-static and debootstrap are needed: run scripts/install-deps.sh")
    cache = rootfs_cache_dir(tmp_path_factory)
    key = hashlib.sha256(f"bookworm arm64 {ARM64_PACKAGES}".encode()).hexdigest()[:16]
    root = cache / f"arm64-python-{key}"
    if (root / ".done").exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    subprocess.run(
        ["debootstrap", "--arch=arm64", "--foreign", "--variant=minbase", f"--include={ARM64_PACKAGES}"]
        + ["bookworm", str(root), apt_mirror()],
        check=True,
        capture_output=True,
        timeout=TIMEOUT_S,
    )
    for deb in sorted((root / "var/cache/apt/archives").glob("*.deb")):
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True, timeout=60)
    (root / ".done").touch()
    return root


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """Region `edge` (central storage) that accepts devices without a TPM."""
    with start_control_plane(tmp_path_factory.mktemp("device-bundle-cp") / "home") as server:
        for args in (
            ["provider", "enable", "physical"],
            ["region", "create", "edge", "--provider", "physical", "--storage-mode", "central"],
            ["region", "update", "edge", "--allow-devices-without-tpm"],
        ):
            assert server.provision(*args).returncode == 0
        yield server


@pytest.fixture(scope="module")
def built(cp: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("device-bundle")
    bundle = out / "bundle.json"
    made = cp.provision("region", "bundle", "edge", "-o", str(bundle), "--allow-loopback")
    assert made.returncode == 0, made.stderr
    first = _build(bundle, out / "a.tar.gz", "--allow-loopback")
    second = _build(bundle, out / "b.tar.gz", "--allow-loopback")
    return {"bundle": bundle, "first": first, "second": second, "dir": out}


def _build(bundle: Path, output: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(IMAGE_BUILDER), "device-bundle", "--region-bundle", str(bundle), "-o", str(output), "--json"]
        + list(extra),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env={**os.environ, "SOURCE_DATE_EPOCH": "1700000000"},
    )


def _unpack(archive: Path, into: Path) -> Path:
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="tar")
    return into / "rigbase-device"


def test_the_bundle_is_complete_reproducible_and_aarch64_only(built: dict[str, Any], tmp_path: Path) -> None:
    first, second = built["first"], built["second"]
    assert first.returncode == 0, first.stderr
    doc = json.loads(first.stdout)
    assert doc["sha256"] == json.loads(second.stdout)["sha256"]  # same inputs, same bytes
    assert doc["target"] == {
        "arch": "aarch64",
        "python": "/usr/bin/python3.11",
        "abi": "cp311",
        "platforms": ["manylinux_2_28_aarch64", "manylinux_2_17_aarch64", "manylinux2014_aarch64"],
    }
    assert doc["left_out"] == ["tpm2-pytss"] and doc["region"] == "edge"
    top = _unpack(Path(doc["output"]), tmp_path)
    for name in ("install.sh", "rigbase-minion.service", "bundle.json", "jetson.yaml", "SHA256SUMS"):
        assert (top / name).is_file(), name
    assert json.loads((top / "bundle.json").read_text()) == json.loads(built["bundle"].read_text())
    assert subprocess.run(["sha256sum", "--quiet", "-c", "SHA256SUMS"], cwd=top).returncode == 0
    site = top / "opt/rigbase/lib/python"
    compiled = sorted(site.rglob("*.so"))
    assert len(compiled) >= 5  # pydantic-core, cryptography, cffi, PyYAML, MarkupSafe, zeroconf, miniupnpc
    machines = {int.from_bytes(so.read_bytes()[18:20], "little") for so in compiled}
    assert machines == {183}, machines  # EM_AARCH64 only
    assert (site / "minion" / "cli.py").is_file() and not (site / "provisioner").exists()
    launcher = (top / "opt/rigbase/bin/minion").read_text()
    assert launcher.startswith("#!/usr/bin/python3.11\n") and '"/opt/rigbase/lib/python"' in launcher
    assert (
        "ExecStart=/opt/rigbase/bin/minion run --bundle /etc/rigbase/bundle.json"
        in (top / "rigbase-minion.service").read_text()
    )
    # a bundle that points at loopback can never reach its control plane from a device: refused, no file
    refused = _build(built["bundle"], tmp_path / "loop.tar.gz")
    assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "loopback" in refused.stderr and not (tmp_path / "loop.tar.gz").exists()


def _install(top: Path, root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", str(top / "install.sh"), "--root", str(root), "--no-start"],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _on_arm64(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The installed minion, run by the tree's aarch64 python3.11 under qemu-user; absolute paths the
    program opens resolve inside `root` first (qemu's -L), as they would on the device."""
    assert QEMU is not None
    return subprocess.run(
        [QEMU, "-L", str(root), str(root / "usr/bin/python3.11"), "/opt/rigbase/bin/minion", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env={k: v for k, v in os.environ.items() if not k.startswith(("RIGBASE_", "PYTHON"))},
    )


def test_install_sh_installs_an_aarch64_minion_that_joins_with_its_device_key(
    built: dict[str, Any], arm64_root: Path, cp: ControlPlane, tmp_path: Path
) -> None:
    top = _unpack(Path(json.loads(built["first"].stdout)["output"]), tmp_path / "unpacked")
    # refusals: no Python 3.11, an x86 one, a file that changed after the build
    empty = tmp_path / "empty-root"
    (empty / "usr/bin").mkdir(parents=True)
    no_python = _install(top, empty)
    assert no_python.returncode == 1 and "no Python 3.11 at /usr/bin/python3.11" in no_python.stderr
    os.symlink(os.path.realpath(shutil.which("python3") or "/usr/bin/python3"), empty / "usr/bin/python3.11")
    x86 = _install(top, empty)
    assert x86.returncode == 1 and "is not an aarch64 program" in x86.stderr, x86.stderr
    root = tmp_path / "device"
    subprocess.run(["cp", "-a", str(arm64_root), str(root)], check=True)  # device nodes as nodes, unread
    catalogue = top / "jetson.yaml"
    kept = catalogue.read_bytes()
    catalogue.write_bytes(kept + b"# changed\n")
    changed = _install(top, root)
    assert changed.returncode == 1 and "differ from SHA256SUMS" in changed.stderr
    assert not (root / "opt/rigbase").exists()
    catalogue.write_bytes(kept)
    # installed: the tree, the bundle (0600), the identity (no TPM: a device key), the unit
    done = _install(top, root)
    assert done.returncode == 0, done.stderr
    assert "RIGBASE_DEVICE_KEY=1" in done.stdout
    assert stat.S_IMODE((root / "etc/rigbase/bundle.json").stat().st_mode) == 0o600
    assert stat.S_IMODE((root / "var/lib/rigbase/minion").stat().st_mode) == 0o700
    assert (root / "etc/rigbase/minion.env").read_text() == "RIGBASE_DEVICE_KEY=1\n"
    assert (root / "etc/systemd/system/rigbase-minion.service").is_file()
    assert os.readlink(root / "usr/local/bin/minion") == "/opt/rigbase/bin/minion"
    assert _install(top, root).returncode == 0  # again: an upgrade in place
    # the aarch64 minion recognises a Xavier NX from its device tree (catalogue from /usr/share/rigbase)
    xavier = hardware.load_profile("lab-jetson-xavier-nx")
    host = hardware.write_jetson_files(xavier, hardware.write_host_root(xavier, tmp_path / "xavier"))
    seen = _on_arm64(root, "inventory", "--host-root", str(host), "--json")
    assert seen.returncode == 0, seen.stderr[-2000:]
    inventory = json.loads(seen.stdout)
    assert (inventory["device"]["model"], inventory["device"]["tpm"]) == ("xavier-nx", "none"), inventory
    inventory["tpm"] = {"present": False, "source": "the Xavier has none (not this test host's)"}
    inventory_file = tmp_path / "inventory.json"
    inventory_file.write_text(json.dumps(inventory))
    # its device key, then the join over TLS to the control plane on loopback
    state = str(tmp_path / "state")
    shown = _on_arm64(root, "id", "--device-key", "--state-dir", state, "--json")
    assert shown.returncode == 0, shown.stderr[-2000:]
    minion_id = json.loads(shown.stdout)["minion_id"]
    joined = _on_arm64(
        root,
        "join",
        "--device-key",
        "--bundle",  # the file install.sh installed (qemu's -L does not redirect click's access() check)
        str(root / "etc/rigbase/bundle.json"),
        "--state-dir",
        state,
        "--inventory",
        str(inventory_file),
    )
    assert joined.returncode == 0 and joined.stdout.startswith("pending: attested"), (
        joined.stdout + joined.stderr[-2000:]
    )
    with cp.client() as client:
        rows = client.get("/v1/pending-minions").json()["items"]
    row = next(r for r in rows if r["minion_id"] == minion_id)
    assert row["identity"] == "device-key" and row["attested"] is True, row
