"""The top-level Vagrantfile (docs/vagrant.md): `vagrant validate` with the libvirt provider's plugin
checks every provider setting, and the Vagrantfile's own settings refuse bad values in one line.

Real `vagrant up` runs are tests/image_builder/test_vagrant_up.py and test_vagrant_join.py."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _validate(tmp_path: Path, **settings: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("vagrant") is None:
        pytest.fail("vagrant is missing: apt-get install vagrant vagrant-libvirt (scripts/install-deps.sh)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RIGBASE_")}
    env |= {"RIGBASE_DISK_DIR": str(tmp_path / "disks"), "VAGRANT_HOME": str(tmp_path / "vagrant.d")}
    env |= settings
    return subprocess.run(
        ["vagrant", "validate"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("profile", ["storage", "compute"])
def test_vagrantfile_validates_and_creates_nothing(tmp_path: Path, profile: str) -> None:
    done = _validate(tmp_path, RIGBASE_NODES="3", RIGBASE_NODE_PROFILE=profile, RIGBASE_ACCEL="qemu")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "validated successfully" in done.stdout
    assert not (tmp_path / "disks").exists()  # drives are made by `vagrant up`, not by validate


@pytest.mark.parametrize("mode", ["none", "nat", "user", "off"])
def test_every_network_mode_validates(tmp_path: Path, mode: str) -> None:
    done = _validate(tmp_path, RIGBASE_NETWORK_MODE=mode, RIGBASE_ACCEL="qemu")
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("RIGBASE_NODES", "0"),
        ("RIGBASE_NODE_MEMORY", "lots"),
        ("RIGBASE_NODE_PROFILE", "gpu"),
        ("RIGBASE_ACCEL", "hvf"),
        ("RIGBASE_NETWORK_ADDRESS", "rigbase.lan"),
        ("RIGBASE_NETWORK_MODE", "bridge"),
    ],
)
def test_a_bad_setting_is_one_line_naming_it(tmp_path: Path, name: str, value: str) -> None:
    done = _validate(tmp_path, **{name: value})
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(name), done.stderr


def test_the_plugin_checks_provider_settings(tmp_path: Path) -> None:
    """The validation is real: a misspelt libvirt setting fails it."""
    bad = (
        (REPO / "Vagrantfile")
        .read_text()
        .replace("lv.cpus = CPUS", "lv.cpus = CPUS\n        lv.cpu_count = 2")
    )
    (tmp_path / "Vagrantfile").write_text(bad.replace("__dir__", repr(str(REPO))))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RIGBASE_")}
    env |= {"VAGRANT_HOME": str(tmp_path / "vagrant.d"), "RIGBASE_DISK_DIR": str(tmp_path / "disks")}
    done = subprocess.run(
        ["vagrant", "validate"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0 and "cpu_count" in done.stdout + done.stderr, done.stdout + done.stderr
