"""Simulated Jetson devices in the lab (`provision lab up --devices N`, docs/lab.md and docs/devices.md "In
the lab"): each profile is recognised by the real minion code from the files the lab writes; a local-storage
lab refuses devices; and for real, a device joins with its swtpm, becomes active, runs a deployed
configuration's container with podman and reports it running, then exited.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from minion.hardware import jetson
from minion.hardware.model import Cpu, Inventory, Tpm
from minion.hardware.requirements import check
from provisioner.lab import hardware, job_runtime
from provisioner.lab.state import LabState
from provisioner.lab.topology import DEVICE_DEMO_MODEL, NAME_PATTERN, LabPlan
from tests.fixtures.leftovers import processes_naming
from tests.provisioner.test_lab import (  # noqa: F401 - the fixtures are used by name
    cached_lab_home,
    lab_home,
    lab_namespaces,
    provision,
    rootfs_cache,
)

# profile → (model, memory GiB, TPM, chip id)
EXPECTED_MODELS = {
    "lab-jetson-agx-orin": ("agx-orin", 32, "firmware", 0x23),
    "lab-jetson-xavier-nx": ("xavier-nx", 8, "none", 0x19),
    "lab-jetson-orin-nx": ("orin-nx", 16, "firmware", 0x23),
    "lab-jetson-orin-nano": ("orin-nano", 8, "firmware", 0x23),
}
STATUS_TIMEOUT_S = 60


# -- without a lab ---------------------------------------------------------------------------------------


def test_devices_cycle_through_the_jetson_profiles_with_fixed_names() -> None:
    plan = LabPlan(nodes=1, devices=5)
    devices = plan.device_plans()
    assert [(d.name, d.netns, d.address, d.profile) for d in devices] == [
        ("device-1", "rigbase-lab-device1", "10.77.0.41", "lab-jetson-agx-orin"),
        ("device-2", "rigbase-lab-device2", "10.77.0.42", "lab-jetson-xavier-nx"),
        ("device-3", "rigbase-lab-device3", "10.77.0.43", "lab-jetson-orin-nx"),
        ("device-4", "rigbase-lab-device4", "10.77.0.44", "lab-jetson-orin-nano"),
        ("device-5", "rigbase-lab-device5", "10.77.0.45", "lab-jetson-agx-orin"),
    ]
    assert all(NAME_PATTERN.match(n) for n in plan.namespaces())
    assert (plan.storage_mode, LabPlan(nodes=1).storage_mode) == ("central", "local")
    assert LabPlan().devices == 0 and LabPlan().namespaces() == LabPlan(devices=0).namespaces()
    with pytest.raises(ValueError, match="--devices 17 is out of range"):
        LabPlan(devices=17)


@pytest.mark.parametrize("profile_name", sorted(EXPECTED_MODELS))
def test_each_profile_is_recognised_by_the_minion(tmp_path: Path, profile_name: str) -> None:
    profile = hardware.load_profile(profile_name)
    root = hardware.write_jetson_files(profile, hardware.write_host_root(profile, tmp_path / "root"))
    report = jetson.recognise(root)
    assert report is not None
    assert (report.model, report.memory_gib, report.tpm, report.chip_id) == EXPECTED_MODELS[profile_name]
    assert (report.l4t_release, report.jetpack) == ("R35.4.1", "5.1.2")
    assert ("tpm" in profile) == (report.tpm != "none")  # the lab starts a swtpm only where the model has one
    assert (report.video_devices, report.media_devices) == ([], [])  # no host camera handed to containers


def test_the_server_rules_do_not_apply_to_a_recognised_jetson(tmp_path: Path) -> None:
    """Else no real Jetson could join: one NVMe (or none) and 1 GbE fail the server rules."""
    profile = hardware.load_profile("lab-jetson-orin-nano")
    root = hardware.write_jetson_files(profile, hardware.write_host_root(profile, tmp_path / "root"))
    small = Inventory(hostname="d", cpu=Cpu(6, 6), memory_total_bytes=8 * 2**30, tpm=Tpm(True, 2))
    assert not check(small, "central").ok
    small.device = jetson.recognise(root)
    assert check(small, "central").ok and check(small, "central").rules == []


def test_the_l4t_gpu_spec_is_written_only_where_no_other_spec_has_that_kind(tmp_path: Path) -> None:
    etc, run = tmp_path / "etc-cdi", tmp_path / "run-cdi"
    ours = job_runtime.write_l4t_cdi_spec((etc, run))
    assert ours == run / job_runtime.L4T_SPEC_NAME
    assert json.loads(ours.read_text())["kind"] == "nvidia.com/gpu"
    assert job_runtime.write_l4t_cdi_spec((etc, run)) == ours  # its own spec does not count
    assert job_runtime.remove_cdi_specs(run) == [ours]
    etc.mkdir()
    (etc / "nvidia.yaml").write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\n")
    assert job_runtime.write_l4t_cdi_spec((etc, run)) is None and not ours.exists()


def test_a_local_storage_lab_refuses_devices_with_one_line(lab_home: Path) -> None:  # noqa: F811
    (lab_home / "lab").mkdir()
    LabState(home=str(lab_home), storage_mode="local").save()  # what `lab up` without --devices records
    refused = provision(lab_home, "lab", "up", "--nodes", "1", "--devices", "1")
    assert refused.returncode != 0
    assert refused.stderr.strip().splitlines() == [
        "error: the lab's region lab uses local storage and devices need a central-storage region: "
        "run `provision lab down --yes`, then `provision lab up --devices 1`"
    ]
    assert lab_namespaces() == []  # nothing was made


# -- for real --------------------------------------------------------------------------------------------


def _ok(home: Path, *args: str, timeout: float = 60) -> str:
    done = provision(home, *args, timeout=timeout)
    assert done.returncode == 0, f"provision {' '.join(args)}: {done.stderr[-2000:]}"
    return done.stdout


def _inference(home: Path, wanted: set[str]) -> dict[str, Any]:
    deadline = time.monotonic() + STATUS_TIMEOUT_S
    while True:
        shown: dict[str, Any] = json.loads(_ok(home, "device", "status", "device-1", "--json"))
        if shown.get("inference_status") in wanted or time.monotonic() > deadline:
            return shown
        time.sleep(1)


@pytest.mark.slow
def test_a_device_joins_becomes_active_and_runs_a_deployed_config(cached_lab_home: Path) -> None:  # noqa: F811
    home = cached_lab_home
    up = provision(home, "lab", "up", "--nodes", "1", "--devices", "2", "--json", timeout=600)
    assert up.returncode == 0, up.stderr[-3000:]
    report = json.loads(up.stdout)
    rows = {n["name"]: n for n in report["nodes"]}
    assert (rows["node-1"]["service"], rows["node-1"]["state"]) == ("storage", "active")
    assert (rows["device-1"]["service"], rows["device-1"]["state"]) == ("device", "active")
    assert rows["device-1"]["inventory"]["device"]["model"] == "agx-orin"
    # the Xavier NX has no TPM: its minion joined with its device key, which the lab's region allows
    assert (rows["device-2"]["state"], rows["device-2"]["inventory"]["device"]["model"]) == (
        "active",
        "xavier-nx",
    )
    shown = json.loads(_ok(home, "device", "show", "device-2", "-o", "json"))
    assert (shown["identity"], shown["device"]["tpm"]) == ("device-key", "none"), shown
    assert json.loads(_ok(home, "device", "show", "device-1", "-o", "json"))["identity"] == "tpm"
    assert (home / "lab" / "nodes" / "device-2" / "minion" / "device-key.pem").exists()
    assert not (home / "lab" / "nodes" / "device-2" / "swtpm").exists()
    assert report["storage_mode"] == "central"
    history = _ok(home, "device", "history", "device-1")
    assert all(state in history for state in ("new", "enrolling", "provisioning", "active"))
    assert "DEVICE" in _ok(home, "lab", "status")

    config = ["--region", "lab", "--image", "localhost/rigbase-lab:latest", "--model", DEVICE_DEMO_MODEL]
    _ok(home, "device-config", "add", "hello", *config, "--command", "echo hello from device-1; sleep 600")
    _ok(home, "device", "set-config", "device-1", "hello")
    _ok(home, "device", "deploy", "device-1")
    shown = _inference(home, {"running", "failed"})
    assert shown["inference_status"] == "running", shown
    assert "running" in _ok(home, "device", "status")

    _ok(home, "device-config", "add", "once", *config, "--command", "echo done; exit 3")
    _ok(home, "device", "set-config", "device-1", "once")
    _ok(home, "device", "deploy", "device-1")
    shown = _inference(home, {"exited", "failed"})
    assert (shown["inference_status"], shown["exit_code"], shown["last_lines"]) == ("exited", 3, "done"), (
        shown
    )
    assert "exited" in _ok(home, "device", "status")

    down = provision(home, "lab", "down", "--yes", timeout=120)
    assert down.returncode == 0, down.stderr
    assert lab_namespaces() == [] and processes_naming(home / "lab") == []
    assert not (job_runtime.CDI_DIR / job_runtime.L4T_SPEC_NAME).exists()
