"""The minion's GPU health (minion/gpu/health.py) against NVML answers in the form `minion gpu health
--record` writes (tests/minion/nvml/), and against the real nvidia-ml-py bindings on this machine, which
has no driver. The recordings here follow NVML's own error codes (nvml.h) and answers; no GPU machine was
lent when they were written, so none of them was recorded on a real GPU yet: scripts/gpu-check.sh records
one (its `health` check) wherever it runs.

The rules: a GPU NVML cannot open or that fell off the bus is lost; uncorrectable ECC errors or a fatal Xid
fail it; a process outside rigbase's containers makes it busy; only ok GPUs are offered, and a failed one
takes the node out of placement. NVML that cannot start says why in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from contracts.gpu_health import GpuHealthReport, GpuState
from contracts.heartbeat import parse_actual
from contracts.heartbeat_keys import HeartbeatKey
from minion import desired
from minion.gpu import agent
from minion.gpu.health import NvmlAnswers, PynvmlReader, RecordedReader, assess, in_rigbase_container
from minion.gpu.keeper import CdiKeeper
from tests.minion.test_gpu_cdi import needs_mknod, rootfs_1

RECORDED = Path(__file__).parent / "nvml"
MINION = Path(sys.executable).parent / "minion"
OURS = {4242}  # the pid the recordings give a rigbase worker; 9001 is another program's


def _ours(pid: int) -> bool:
    return pid in OURS


def test_a_worker_on_one_gpu_and_another_program_on_the_other() -> None:
    report = assess(RecordedReader(RECORDED / "h100x2-busy.json").read(), ours=_ours)
    assert report.driver_version == "550.127.05" and report.problem is None
    first, second = report.gpus
    assert (first.state, first.reason, first.outside_pids) == (GpuState.OK, None, [])
    assert (first.name, first.pcie_gen, first.pcie_width, first.mig) == (
        "NVIDIA H100 80GB HBM3",
        5,
        16,
        False,
    )
    assert (first.power_w, first.util_pct, first.memory_used_bytes) == (612.4, 97.0, 61203283968)
    assert second.state is GpuState.BUSY and second.outside_pids == [9001]
    assert second.reason == "held by 1 process(es) outside rigbase's containers (pid 9001)"
    assert report.offered() == 1 and report.out_of_placement() is None


def test_ecc_and_xid_fail_a_gpu_and_a_lost_or_unopened_one_is_not_offered() -> None:
    report = assess(RecordedReader(RECORDED / "h100x4-faults.json").read(), ours=_ours)
    states = [(g.index, g.state) for g in report.gpus]
    assert states == [(0, GpuState.FAILED), (1, GpuState.FAILED), (2, GpuState.LOST), (3, GpuState.LOST)]
    ecc, xid, lost, unopened = report.gpus
    assert ecc.reason == "uncorrectable ECC errors (3) since the driver loaded"
    assert xid.xid == 79 and xid.reason == "Xid 79 (the GPU has fallen off the bus)"
    assert lost.reason == "it has fallen off the bus (NVML: GPU is lost)"
    assert unopened.reason == "NVML cannot open it (NVML: Insufficient Permissions)"
    assert report.offered() == 0
    assert report.out_of_placement() == (
        "GPU 0 failed: uncorrectable ECC errors (3) since the driver loaded (and 1 more)"
    )


@pytest.mark.parametrize(
    ("recording", "words"),
    [
        ("driver-not-loaded.json", "kernel module is not loaded: boot the image built with --with-nvidia"),
        ("version-mismatch.json", "kernel module and its user-space libraries are different versions"),
    ],
)
def test_nvml_that_cannot_start_is_one_line_saying_what_to_do(recording: str, words: str) -> None:
    report = assess(RecordedReader(RECORDED / recording).read())
    assert report.gpus == [] and report.problem is not None and words in report.problem
    assert "\n" not in report.problem


def test_the_real_bindings_say_what_this_machine_has() -> None:
    """nvidia-ml-py itself: with no libnvidia-ml (this project's machines), NVML_ERROR_LIBRARY_NOT_FOUND in
    one line; on a machine with a driver, its GPUs, each with a state."""
    answers = PynvmlReader().read()
    report = assess(answers)
    if answers.error_code == 12:
        assert report.problem == "no NVIDIA driver on this node (libnvidia-ml is not installed)"
    else:
        assert report.problem is not None or report.gpus, report
        assert all(g.state in GpuState for g in report.gpus)


def test_a_recording_round_trips(tmp_path: Path) -> None:
    answers = RecordedReader(RECORDED / "h100x4-faults.json").read()
    (tmp_path / "again.json").write_text(answers.dump())
    assert NvmlAnswers.load((tmp_path / "again.json").read_text()) == answers


def test_only_processes_outside_rigbases_containers_make_a_gpu_busy(tmp_path: Path) -> None:
    for pid, cgroup in [(10, "0::/machine.slice/libpod-3f2a.scope/container\n"), (11, "0::/user.slice\n")]:
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(cgroup)
    assert in_rigbase_container(10, tmp_path) and not in_rigbase_container(11, tmp_path)
    assert in_rigbase_container(12, tmp_path)  # gone since NVML listed it: it holds nothing now


def test_the_heartbeat_handler_reports_the_contracts_model() -> None:
    desired.register(HeartbeatKey.GPU_HEALTH, agent.handler(RecordedReader(RECORDED / "h100x4-faults.json")))
    try:
        actual = desired.apply({"gpu_health": True})
        report = parse_actual(actual)[HeartbeatKey.GPU_HEALTH]
        assert [g.state for g in report.gpus].count(GpuState.FAILED) == 2
        assert parse_actual(desired.apply({"gpu_health": False}))[HeartbeatKey.GPU_HEALTH].gpus == []
    finally:
        desired.register(HeartbeatKey.GPU_HEALTH, agent.handler(PynvmlReader()))


def test_a_cdi_directory_the_minion_cannot_write_is_the_reports_one_line(tmp_path: Path) -> None:
    """The keeper's note travels in the report, so `node show` says why no GPU is offered; a driver NVML
    cannot start has its own line, and the spec's note (the same cause) is not repeated."""
    needs_mknod()
    root = rootfs_1(tmp_path / "driver-root")
    (tmp_path / "file").write_text("not a directory")
    blocked = CdiKeeper(tmp_path / "file" / "cdi", (tmp_path / "file" / "cdi",), root=root)
    handle = agent.handler(RecordedReader(RECORDED / "h100x2-busy.json"), blocked.refresh)
    report = GpuHealthReport.model_validate(handle(True))
    where = tmp_path / "file" / "cdi"
    assert report.cdi_problem is not None and report.cdi_problem.startswith(
        f"cannot write the CDI spec in {where} (Not a directory): its GPUs cannot be given"
    )
    assert report.offered() == 0 and "\n" not in report.cdi_problem
    no_module = agent.handler(RecordedReader(RECORDED / "driver-not-loaded.json"), blocked.refresh)
    assert GpuHealthReport.model_validate(no_module(True)).cdi_problem is None


def test_minion_gpu_health_replays_a_recording_and_exits_1_on_a_bad_gpu(tmp_path: Path) -> None:
    shown = subprocess.run(
        [str(MINION), "gpu", "health", "--replay", str(RECORDED / "h100x4-faults.json")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert shown.returncode == 1, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == "driver 550.127.05" and len(lines) == 5, lines
    assert lines[3].startswith("GPU 2  lost") and "fallen off the bus" in lines[3]
    missing = subprocess.run(
        [str(MINION), "gpu", "health", "--replay", str(tmp_path / "none.json")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1 and "--record" in missing.stderr
