"""A device's inference container as a real rootful podman container, driven through the device agent's
desired-state handler (minion/devices/agent.py) the way tests/minion/test_jobs_podman.py drives jobs: the
same tiny image, the same CDI spec whose "GPU" is /dev/null (here the Jetson accelerator, by CDI name),
and logs to a real HTTP server on loopback that speaks the device log route (LogChunk/LogAck by offset).

What the product rules (docs/product-rules.md) asks: the configuration's env and keys, the accelerator and
the video devices, the
model mounted read-only and the datastore path at TRAINML_OUTPUT_PATH; an exit is reported with its code
and last lines and NOT restarted (not by more heartbeats, not by a restarted minion), but a reboot (a new
boot id) starts it again; a running container is adopted by a restarted minion, a new deploy replaces it
and no configuration stops it."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from contracts.device import DeviceActual, DeviceDesired, DeviceInference
from contracts.jobs import Mount
from minion.devices.agent import DeviceAgent, DeviceLogs
from minion.jobs.podman import Podman
from minion.join.client import ControlPlane, Enrollment
from minion.settings import ContainerSettings
from tests.minion.test_jobs_podman import KeyedLogStore, LogServer, gpu_kind, image, settings


@pytest.fixture(scope="module")
def jobs_network() -> tuple[str, str]:
    """settings' jobs network: devices' containers never use it (they are the node's own), so nothing
    makes it; named apart from test_jobs_podman's all the same."""
    return "rigbase-jt-device", "10.231.5.0/24"


__all__ = ["gpu_kind", "image", "settings"]

ROUTE = re.compile(r"^/v1/nodes/node-1/device/logs$")
Logs = tuple[KeyedLogStore[str], int]  # the receiver's store (output per generation) and its port


@pytest.fixture
def logs() -> Iterator[Logs]:
    """The device log route's receiver: output per generation."""
    store = KeyedLogStore[str]()
    server = LogServer(lambda _, chunk: store.take(chunk.generation or "", chunk), route=ROUTE)
    yield store, server.port
    server.close()


Agents = Callable[[], DeviceAgent]


@pytest.fixture
def agents(settings: ContainerSettings, logs: Logs, tmp_path: Path, gpu_kind: str) -> Iterator[Agents]:
    """Agents on one state directory (a restarted minion is a second one), booted as tmp_path/boot_id says."""
    made: list[DeviceAgent] = []
    cp = ControlPlane(Enrollment(f"http://127.0.0.1:{logs[1]}", None), timeout=5.0)
    node = {"node_id": "node-1", "node_credential": "cred-1"}
    (tmp_path / "boot_id").write_text("boot-one\n")

    def make() -> DeviceAgent:
        agent = DeviceAgent.create(
            settings,
            tmp_path / "state",
            DeviceLogs(cp, lambda: node),
            boot_id_path=tmp_path / "boot_id",
            accelerator=f"{gpu_kind}=0",  # the Jetson GPU by CDI name (nvidia.com/gpu=all on L4T)
            devices=lambda: ["/dev/zero:/dev/video0"],  # a camera
        )
        made.append(agent)
        return agent

    yield make
    for agent in made:
        agent.close(wait_s=2)
    podman = Podman(settings)
    for owner in {a.rt.owner for a in made}:
        for container in podman.owned(owner):
            podman.remove(container.name)
    cp.close()


def inference(command: str, generation: str = "dcf_1.r1.d1", **fields: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "config": "detect",
        "config_id": "dcf_1",
        "revision": 1,
        "generation": generation,
        "image": "localhost/rigbase-jobs-test:1",
        "command": command,
    } | fields
    return DeviceDesired(inference=DeviceInference(**values)).model_dump(mode="json")


def until(agent: DeviceAgent, desired: dict[str, Any], done: Callable[[DeviceActual], bool]) -> DeviceActual:
    deadline = time.monotonic() + 30
    while True:
        actual = DeviceActual.model_validate(agent.handle(desired))
        if done(actual):
            return actual
        assert time.monotonic() < deadline, f"timed out; last actual: {actual.model_dump()}"
        time.sleep(0.3)


def state_is(*states: str, generation: str = "") -> Callable[[DeviceActual], bool]:
    """The container is in one of `states`, in a generation that starts with `generation`."""
    return lambda a: (
        a.inference is not None
        and a.inference.state in states
        and a.inference.generation.startswith(generation)
    )


def test_exit_is_reported_with_its_last_lines_not_restarted_but_a_reboot_starts_it_again(
    image: str,
    agents: Agents,
    logs: Logs,
    settings: ContainerSettings,
    tmp_path: Path,
) -> None:
    store, _ = logs
    (settings.cache_dir / "models" / "yolo").mkdir(parents=True)
    (settings.cache_dir / "models" / "yolo" / "weights").write_text("w1\n")
    share, staging = tmp_path / "share", settings.datastore_dir / "nas"
    (share / "detections").mkdir(parents=True)
    staging.mkdir(parents=True)
    subprocess.run(["mount", "--bind", str(share), str(staging)], check=True)
    try:
        command = (
            'echo "out=$TRAINML_OUTPUT_PATH rig=$RIGBASE_OUTPUT_PATH key=$API_TOKEN"; '
            '[ -c /dev/video0 ] && echo has-video; [ -c "$RIGBASE_TEST_GPU_DEV" ] && echo has-accelerator; '
            'cat /opt/ml/model/weights; echo found >> "$TRAINML_OUTPUT_PATH/r.txt"; exit 3'
        )
        desired = inference(
            command,
            env={"API_TOKEN": "s3cret"},
            mounts=[
                Mount(source_kind="cache", path="/models/yolo", target="/opt/ml/model", read_only=True),
                Mount(source_kind="datastore", datastore="nas", path="/detections", target="/opt/ml/output"),
            ],
        )
        agent = agents()
        actual = until(agent, desired, lambda a: state_is("exited")(a) and a.inference.log_acked > 0)  # type: ignore[union-attr]
        report = actual.inference
        assert report is not None and report.exit_code == 3 and report.generation == "dcf_1.r1.d1.bbootone"
        assert "not restarted" in (report.message or "")
        assert report.last_lines is not None and report.last_lines.endswith("has-accelerator\nw1")
        out = store.output(report.generation)
        assert "out=/opt/ml/output rig=/opt/ml/output key=s3cret\nhas-video\nhas-accelerator\nw1\n" == out
        assert (share / "detections" / "r.txt").read_text() == "found\n"
        # more heartbeats, and a restarted minion in the same boot: still exited, never run again
        for _ in range(3):
            assert state_is("exited")(DeviceActual.model_validate(agent.handle(desired)))
            time.sleep(0.3)
        agent.close()
        again = agents()
        assert until(again, desired, state_is("exited")).inference.exit_code == 3  # type: ignore[union-attr]
        assert (share / "detections" / "r.txt").read_text() == "found\n"
        # the device reboots: a new boot id, the container runs again (its output under the new generation)
        (tmp_path / "boot_id").write_text("boot-two\n")
        rebooted = until(again, desired, state_is("exited", generation="dcf_1.r1.d1.bboottwo"))
        assert rebooted.inference is not None and rebooted.inference.exit_code == 3
        assert (share / "detections" / "r.txt").read_text() == "found\nfound\n"
    finally:
        subprocess.run(["umount", "--lazy", str(staging)], check=False)


def test_a_running_container_is_adopted_replaced_by_a_deploy_and_stopped_without_a_config(
    image: str, agents: Agents, settings: ContainerSettings
) -> None:
    podman = Podman(settings)
    first = inference("echo serving; sleep 60")
    agent = agents()
    until(agent, first, state_is("running"))
    owner = agent.rt.owner
    [container] = podman.owned(owner)
    agent.close()
    # a restarted minion adopts it: the same container, still running
    again = agents()
    assert until(again, first, state_is("running")).inference.generation == "dcf_1.r1.d1.bbootone"  # type: ignore[union-attr]
    assert [c.name for c in podman.owned(owner) if c.running] == [container.name]
    # a new deploy replaces it
    second = inference("echo two; sleep 60", generation="dcf_1.r2.d2", revision=2)
    until(again, second, state_is("running", generation="dcf_1.r2.d2"))
    running = [c for c in podman.owned(owner) if c.running]
    assert len(running) == 1 and running[0].labels["rigbase.generation"].startswith("dcf_1.r2.d2")
    # no configuration: it stops, and nothing is reported
    none = DeviceDesired().model_dump(mode="json")
    until(again, none, lambda a: a.inference is None and not [c for c in podman.owned(owner) if c.running])
    # a minion restarted after the configuration went away removes the container it left running
    third_deploy = inference("echo three; sleep 60", generation="dcf_1.r2.d3", revision=2)
    until(again, third_deploy, state_is("running", generation="dcf_1.r2.d3"))
    again.close()
    third = agents()
    until(third, none, lambda a: a.inference is None and not podman.owned(owner))
