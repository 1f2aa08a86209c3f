"""The GCP suite runs with loopback only: nothing in it can reach Google, even by mistake.

When pytest collects tests here outside a network namespace, they are replaced by ONE test that re-runs
exactly those tests in `unshare -n` (a fresh network namespace whose only interface is lo, brought up
first) and reports their outcome. Inside, RIGBASE_GCP_ISOLATED=1 is set and the tests run normally; a
test in test_isolation.py proves a public address is unreachable there."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

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
