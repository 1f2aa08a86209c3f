"""Jobs in the local lab, for real: `provision lab up` with one node, a project, a job whose worker runs as a
rootful podman container in the node's network namespace (the lab's own image, imported from the cached
Debian root; one of the node's CDI "GPUs", which are /dev/null), its logs followed to the end, a job
waiting for a GPU type the lab lacks, and `lab down` removing a job container that was still running.
The job's metrics are read twice: with `job metrics`, and from the console's chart in headless Chromium.

Also the pieces without a lab: the minion environment chosen from this machine's facts, the CDI spec,
and the image import keyed by the root's cache key.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from contracts.errors import Unavailable
from provisioner.lab import job_image, job_runtime, notebook_image
from provisioner.lab.job_runtime import HostFacts
from tests.provisioner.test_console_browser import browser  # noqa: F401 - a fixture, used by name
from tests.provisioner.test_console_charts import chart_data
from tests.provisioner.test_lab import (  # noqa: F401 - the fixtures are used by name
    cached_lab_home,
    lab_home,
    lab_namespaces,
    provision,
    rootfs_cache,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
JOB_TIMEOUT_S = 90


# -- without a lab ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "facts, expected",
    [
        (HostFacts(unified_cgroups=True, systemd=True, cap_sys_resource=True), {}),
        (
            HostFacts(unified_cgroups=False, systemd=True, cap_sys_resource=False),
            {
                job_runtime.OCI_RUNTIME: "runc",
                job_runtime.CGROUP_MANAGER: "cgroupfs",
                job_runtime.ULIMITS: "nofile=1024:1024,nproc=4096:4096",
            },
        ),
        (
            HostFacts(unified_cgroups=True, systemd=False, cap_sys_resource=True),
            {job_runtime.CGROUP_MANAGER: "cgroupfs"},
        ),
    ],
)
def test_podman_defaults_unless_the_machine_lacks_what_they_need(
    facts: HostFacts, expected: dict[str, str]
) -> None:
    assert job_runtime.runtime_settings(facts, {}) == expected


def test_the_operators_settings_win_and_per_node_ones_are_the_labs(tmp_path: Path) -> None:
    facts = HostFacts(unified_cgroups=False, systemd=False, cap_sys_resource=False)
    environ = {job_runtime.OCI_RUNTIME: "crun", job_runtime.NETWORK: "bridge", "RIGBASE_URL": "x"}
    runtime = job_runtime.runtime_settings(facts, environ)
    assert runtime[job_runtime.OCI_RUNTIME] == "crun" and job_runtime.NETWORK not in runtime
    env = job_runtime.minion_environment(
        netns="rigbase-lab-node3", node_dir=tmp_path / "node-3", runtime=runtime, gpus=2
    )
    assert env[job_runtime.NETWORK] == "host"
    assert env[job_runtime.GPU_KIND] == "rigbase-lab-node3.lab.rigbase.dev/gpu"
    assert env[job_runtime.CACHE_DIR] == str(tmp_path / "node-3" / "cache")
    assert env[job_runtime.DATASTORE_DIR] == str(tmp_path / "node-3" / "datastores")
    cpu_only = job_runtime.minion_environment(
        netns="rigbase-lab-node3", node_dir=tmp_path, runtime={}, gpus=0
    )
    assert job_runtime.GPU_KIND not in cpu_only  # the minion's default kind: it finds no GPU


def test_each_node_gets_a_cdi_spec_of_its_own_kind_and_down_removes_only_the_labs(tmp_path: Path) -> None:
    spec = job_runtime.write_cdi_spec("rigbase-lab-node1", 2, tmp_path)
    job_runtime.write_cdi_spec("rigbase-lab-node2", 2, tmp_path)
    (tmp_path / "nvidia.yaml").write_text("cdiVersion: 0.5.0\n")  # a real node's spec is never touched
    data = json.loads(spec.read_text())
    assert data["kind"] == "rigbase-lab-node1.lab.rigbase.dev/gpu"
    assert [d["name"] for d in data["devices"]] == ["0", "1"]
    assert data["devices"][1]["containerEdits"]["mounts"] == [
        {"hostPath": "/dev/null", "containerPath": "/dev/nvidia1", "options": ["bind"]}
    ]
    assert [p.name for p in job_runtime.remove_cdi_specs(tmp_path)] == [
        "rigbase-lab-node1.json",
        "rigbase-lab-node2.json",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nvidia.yaml"]


def test_the_job_image_is_imported_once_per_root(tmp_path: Path) -> None:
    if subprocess.run(["podman", "--version"], capture_output=True).returncode != 0:
        pytest.skip("podman is not installed: scripts/install-deps.sh")
    root = tmp_path / "cache" / "0123456789abcdef" / "root"  # rootfs.ensure_base's layout: CACHE/KEY/root
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "hello").write_text("#!/bin/sh\necho hello\n")
    repository = f"localhost/rigbase-lab-test-{secrets.token_hex(3)}"  # never the lab's own image
    key_tag = job_image.tag_of("0123456789abcdef", repository)
    try:
        image_id, imported = job_image.ensure_image(root, lock_dir=tmp_path, repository=repository)
        assert imported and _image_id(key_tag) == image_id == _image_id(f"{repository}:latest")
        labels = _inspect(key_tag, "{{json .Labels}}")
        assert json.loads(labels)[job_image.KEY_LABEL] == "0123456789abcdef"
        again = job_image.ensure_image(root, lock_dir=tmp_path, repository=repository)
        assert again == (image_id, False)
    finally:
        subprocess.run(["podman", "rmi", "--force", key_tag, f"{repository}:latest"], capture_output=True)


def _inspect(ref: str, fmt: str) -> str:
    proc = subprocess.run(
        ["podman", "image", "inspect", "--format", fmt, ref], capture_output=True, text=True
    )
    return proc.stdout.strip() if proc.returncode == 0 else ""


def _image_id(ref: str) -> str:
    return _inspect(ref, "{{.Id}}")


def test_a_missing_root_is_refused_with_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="provision lab up"):
        job_image.ensure_image(tmp_path / "cache" / "nokey" / "root")
    with pytest.raises(
        Unavailable, match="job image localhost/rigbase-none:latest is missing: run `provision lab up`"
    ):
        notebook_image.ensure_notebook_image("localhost/rigbase-none:latest", lock_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing built, nothing left
    # the key follows the base image and the requirement, so a new base or pin builds a new image
    keys = {notebook_image.image_key(b, r) for b in ("a", "b") for r in (("x",), ("y",))}
    assert len(keys) == 4


# -- a lab with one node ---------------------------------------------------------------------------------


def _ok(home: Path, *args: str, timeout: float = 60) -> str:
    result = provision(home, *args, timeout=timeout)
    assert result.returncode == 0, f"provision {' '.join(args)}: {result.stderr[-3000:]}"
    return result.stdout


def _job(home: Path, name: str) -> dict[str, Any]:
    return dict(json.loads(_ok(home, "job", "show", name, "--json")))


def _wait_state(home: Path, name: str, states: set[str], timeout: float = JOB_TIMEOUT_S) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while (job := _job(home, name))["state"] not in states:
        assert time.monotonic() < deadline, f"{name} is still {job['state']}: {job.get('reason')}"
        time.sleep(0.5)
    return job


def _lab_containers(home: Path) -> list[str]:
    owner = job_runtime.owner_of(home / "lab" / "nodes" / "node-1")
    assert owner
    listed = subprocess.run(
        ["podman", "ps", "--all", "--quiet", "--filter", f"label={job_runtime.OWNER_LABEL}={owner}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return listed.stdout.split()


def test_a_job_runs_in_the_lab_and_its_logs_follow_to_succeeded(
    cached_lab_home: Path,  # noqa: F811
    browser: WebDriver,  # noqa: F811
) -> None:
    home = cached_lab_home
    up = provision(home, "lab", "up", "--nodes", "1", "--json", timeout=300)
    assert up.returncode == 0, up.stderr[-3000:]
    assert (
        job_image.IMAGE
        in subprocess.run(
            ["podman", "images", "--format", "{{.Repository}}:{{.Tag}}"], capture_output=True, text=True
        ).stdout
    )
    assert (job_runtime.CDI_DIR / "rigbase-lab-node1.json").exists()
    _ok(home, "node", "maintenance", "node-1", "off")  # only active nodes take jobs
    _ok(home, "project", "create", "lab-demo")
    _ok(
        home,
        "dataset",
        "create",
        "hello-numbers",
        "--source",
        str(EXAMPLES / "hello-data"),
        "--project",
        "lab-demo",
    )

    job_id = _ok(home, "job", "create", "-f", str(EXAMPLES / "lab-hello.yaml"), "--project", "lab-demo", "-y")
    assert job_id.strip().startswith("job_")
    logs = _ok(home, "job", "logs", "hello-lab", "--follow", timeout=JOB_TIMEOUT_S)
    assert logs.splitlines() == [
        "hello from hello-lab worker 0, GPU 0: /dev/nvidia0",
        "step 1 of 3",
        'rigbase:metric {"step": 1, "loss": 0.7}',
        "step 2 of 3",
        'rigbase:metric {"step": 2, "loss": 0.4}',
        "step 3 of 3",
        'rigbase:metric {"step": 3, "loss": 0.1}',
        "result 5050 written to /opt/ml/output/result.txt",
    ]
    points = json.loads(_ok(home, "job", "metrics", "hello-lab", "--json"))
    assert [(p["worker"], p["step"], p["name"], p["value"]) for p in points] == [
        (0, 1, "loss", 0.7),
        (0, 2, "loss", 0.4),
        (0, 3, "loss", 0.1),
    ]
    job = _wait_state(home, "hello-lab", {"succeeded", "failed"})
    assert (job["state"], job["node"], job["project"]) == ("succeeded", "node-1", "lab-demo")
    assert [(w["state"], w["exit_code"], w["gpu_indices"]) for w in job["workers"]] == [("succeeded", 0, [0])]
    # the console's chart of the job holds the same points, read inside headless Chromium
    client = json.loads((home / "client.json").read_text())
    browser.get(f"{client['url']}/signin")
    browser.find_element(By.ID, "token").send_keys(client["token"], Keys.ENTER)
    WebDriverWait(browser, 30).until(lambda d: "Resources Dashboard" in d.page_source)
    browser.get(f"{client['url']}/jobs/{job_id.strip()}")
    WebDriverWait(browser, 30).until(lambda d: chart_data(d, "metrics"))
    assert chart_data(browser, "metrics") == [[1, 2, 3], [0.7, 0.4, 0.1]]

    # a GPU type the lab does not have: created, and waiting with the reason
    _ok(home, "job", "create", "-f", str(EXAMPLES / "lab-h100.yaml"), "--project", "lab-demo", "-y")
    waiting = _job(home, "needs-h100")
    assert waiting["state"] == "waiting"
    assert "H100 80GB" in waiting["reason"] and "RTX A6000" in waiting["reason"], waiting["reason"]

    # a job still running when the lab goes down: its container goes with it
    spec = home / "sleeper.yaml"
    spec.write_text(
        "name: sleeper\ntype: training\nresources: {gpu_types: [RTX A6000], gpu_count: 1}\n"
        "workers: ['echo sleeping; sleep 600']\nenvironment: {image: localhost/rigbase-lab:latest}\n"
    )
    _ok(home, "job", "create", "-f", str(spec), "-y")
    _wait_state(home, "sleeper", {"running"})
    running = _lab_containers(home)
    assert len(running) == 1
    down = provision(home, "lab", "down", "--yes", timeout=120)
    assert down.returncode == 0, down.stderr
    assert lab_namespaces() == []
    assert not (job_runtime.CDI_DIR / "rigbase-lab-node1.json").exists()
    left = subprocess.run(["podman", "ps", "--all", "--quiet"], capture_output=True, text=True).stdout.split()
    assert not set(running) & set(left)
    assert sorted(p.name for p in home.iterdir()) == ["cache"]
