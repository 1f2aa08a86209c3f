"""The GCP suite runs with loopback only: nothing in it can reach Google, even by mistake.

When pytest collects tests here outside a network namespace, they are replaced by ONE test that re-runs
exactly those tests in `unshare -n` (a fresh network namespace whose only interface is lo, brought up
first) and reports their outcome. Inside, RIGBASE_GCP_ISOLATED=1 is set and the tests run normally; a
test in test_isolation.py proves a public address is unreachable there."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.control_plane import Fakes
from tests.fixtures.gcp import make_sa_key
from tests.provisioner.gcp.fake_compute import quota

ISOLATED_ENV = "RIGBASE_GCP_ISOLATED"
HERE = Path(__file__).resolve().parent


def isolated() -> bool:
    return os.environ.get(ISOLATED_ENV) == "1"


def _run_isolated(nodeids: list[str], rootdir: Path) -> None:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.fail("unshare (util-linux) and ip (iproute2) are needed to run the GCP suite offline")
    env = dict(os.environ, **{ISOLATED_ENV: "1"})
    cmd = [
        "unshare",
        "--net",
        "--",
        "sh",
        "-c",
        'ip link set lo up && exec "$@"',
        "sh",
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-rs",
        "-p",
        "no:cacheprovider",
        *nodeids,
    ]
    proc = subprocess.run(cmd, cwd=rootdir, env=env, capture_output=True, text=True)
    output = proc.stdout + proc.stderr
    print(output)
    if proc.returncode != 0:
        tail = "\n".join(output.splitlines()[-60:])
        pytest.fail(f"GCP suite in `unshare -n` failed (rc {proc.returncode}):\n{tail}", pytrace=False)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if isolated():
        return
    ours = [i for i in items if HERE in Path(str(i.path)).resolve().parents]
    if not ours:
        return
    nodeids = [i.nodeid for i in ours]
    config.hook.pytest_deselected(items=ours)
    rootdir = Path(str(config.rootpath))

    def test_gcp_suite_offline_in_unshare() -> None:
        _run_isolated(nodeids, rootdir)

    wrapper: Any = pytest.Function.from_parent(
        ours[0].parent, name="test_gcp_suite_offline_in_unshare", callobj=test_gcp_suite_offline_in_unshare
    )
    first = items.index(ours[0])
    kept = [i for i in items if i not in ours]
    kept.insert(min(first, len(kept)), wrapper)
    items[:] = kept


# --- the GCP world of the control-plane tests (test_control_plane.py, test_gce_join.py) -----------------
# (a real `provision serve` pointed at the fakes and emulators through tests/fixtures/serve_app.py)

US_CENTRAL1 = [
    quota("CPUS", 72),
    quota("A2_CPUS", 24),
    quota("LOCAL_SSD_TOTAL_GB", 6000),
    quota("NVIDIA_V100_GPUS", 8, 1),
    quota("NVIDIA_A100_GPUS", 4),
]
# GPUs granted, but no CPU and no local SSD quota: the "0 jobs" case of docs/product-rules.md
# "GCP capacity rule", for every type
US_EAST1 = [
    quota("CPUS", 0),
    quota("LOCAL_SSD_TOTAL_GB", 0),
    quota("NVIDIA_V100_GPUS", 8),
    quota("NVIDIA_T4_GPUS", 4),
]


@pytest.fixture()
def gcp_world(
    fake_compute: Any,
    pubsub_emulator: str,
    iam_server: Any,
    logging_server: Any,
    storage_emulator: str,
    request: pytest.FixtureRequest,
) -> dict[str, Any]:
    """The fakes to inject into the server subprocesses, a unique name prefix (the emulators are shared)."""
    fake_compute.fake.region_quotas.update({"us-central1": US_CENTRAL1, "us-east1": US_EAST1})
    fake_compute.fake.storage_url = storage_emulator  # images.insert reads the uploaded archive there
    endpoints = {
        "storage": storage_emulator,
        "compute": fake_compute.url,
        "resource_manager": fake_compute.url,
        "pubsub": pubsub_emulator,
        "pubsub_iam": iam_server.address,
        "logging": logging_server.address,
        "insecure": True,
    }
    prefix = f"t{hashlib.sha256(request.node.name.encode()).hexdigest()[:6]}"
    return {
        "prefix": prefix,
        "compute": fake_compute.fake,
        "iam": iam_server,
        "logging": logging_server,
        "fakes": Fakes(gcp_endpoints=endpoints),
    }


@pytest.fixture()
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "key.json"
    path.write_text(json.dumps(make_sa_key()))
    return path
