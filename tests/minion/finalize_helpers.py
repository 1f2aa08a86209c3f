"""Shared by the minion finalize tests: the real playbook bundle, a lab root cloned from the cached
debootstrap root (RIGBASE_TEST_ROOTFS_CACHE, ~35-50 s to build once), and one work to run."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from contracts.finalize import FinalizeWork, generation_of
from provisioner.lab import rootfs
from provisioner.services.fleet import finalize_bundle
from provisioner.settings import SHIPPED_PLAYBOOKS
from tests.fixtures.rootfs import rootfs_cache_dir

NVME = [
    {"path": "/dev/nvme1n1", "size_bytes": 2 * 10**12},
    {"path": "/dev/nvme2n1", "size_bytes": 2 * 10**12},
]
SATA = [{"path": f"/dev/sd{c}", "size_bytes": 4 * 10**12} for c in "abc"]
CP = "https://10.77.0.1:8470"
BUNDLE = finalize_bundle.build(SHIPPED_PLAYBOOKS)


def variables(**changes: Any) -> dict[str, Any]:
    return {
        "rigbase_node_name": "n1",
        "rigbase_hostname": "n1.lab.example",
        "rigbase_service": "compute",
        "rigbase_region": "lab",
        "rigbase_control_plane_url": CP,
        "rigbase_storage_mode": "local",
        "rigbase_nvme_drives": NVME,
        "rigbase_sata_drives": SATA,
        "rigbase_nfs_clients": ["10.77.0.0/24"],
        "rigbase_nfs_server": None,
    } | changes


def work(retry: int = 0, **changes: Any) -> FinalizeWork:
    values = variables(**changes)
    playbook = f"finalize-{values['rigbase_service']}.yml"
    return FinalizeWork(
        generation=generation_of(BUNDLE.digest, playbook, values, retry),
        bundle_digest=BUNDLE.digest,
        playbook=playbook,
        variables=values,
    )


def write_module_python(directory: Path) -> Path:
    """The image's module-Python launcher (image_builder.node_ansible.module_python) for this checkout and
    this Python, written into `directory`."""
    from image_builder import node_ansible

    repo = Path(__file__).resolve().parents[2]
    [(name, text)] = node_ansible.module_python(python=sys.executable, site=str(repo)).items()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(text)
    path.chmod(0o755)
    return path


def local_play_env(data_dir: Path) -> dict[str, str]:
    """The environment the minion's runner gives a play on a node (runner.ansible_env: pipelining, temp
    files under `data_dir`, the collections), over this process's own."""
    from minion.finalize.runner import ansible_env, find_collections

    return {**os.environ, **ansible_env(data_dir, find_collections(None), local=True)}


def plugin() -> ModuleType:
    """The playbooks' own layout filter, to compare what was written with."""
    spec = importlib.util.spec_from_file_location(
        "rigbase_scratch", SHIPPED_PLAYBOOKS / "filter_plugins" / "rigbase_scratch.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


# -- fixtures (imported by the test modules) -----------------------------------------------------------


@pytest.fixture(scope="session")
def base_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = rootfs_cache_dir(tmp_path_factory)
    return rootfs.ensure_base(cache=cache)


@pytest.fixture
def root(base_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("RIGBASE_HOME", str(tmp_path / "home"))
    path = rootfs.clone(base_root, tmp_path / "home" / "lab" / "roots" / "n1")
    yield path
    rootfs.remove_root(path)
