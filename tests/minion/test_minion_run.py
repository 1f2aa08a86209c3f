"""`minion run` as the lab and the systemd unit run it: a real process with a real swtpm against a real
control plane — pending until the operator adds the node, then joined, heartbeating, state files 0600,
the banner showing the join state, and a clean exit on SIGTERM."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from minion.banner import BannerEnrollment, render
from minion.hardware.model import Inventory
from minion.hardware.requirements import check
from provisioner.lab.swtpm import Swtpm, VendorCA
from tests.fixtures.control_plane import start_control_plane
from tests.fixtures.finalize import finish_finalize
from tests.fixtures.umockdev import Testbed, load_profile, minion_executable


def _wait(predicate: Callable[[], Any], what: str, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@contextmanager
def region_lab(tmp_path: Path, tpm_vendor_ca: VendorCA) -> Iterator[Any]:
    """A control plane (finalize skipped) with region `lab`, the swtpm vendor CA trusted, and the
    region's bundle written to tmp_path/bundle.json."""
    with start_control_plane(tmp_path / "home") as cp:
        ca = tmp_path / "vendor.pem"
        ca.write_bytes(b"".join(tpm_vendor_ca.certificate_pems()))
        for args in (
            ["provider", "enable", "physical"],
            ["region", "create", "lab", "--provider", "physical"],
            ["tpm-ca", "add", str(ca)],
            ["region", "bundle", "lab", "-o", str(tmp_path / "bundle.json"), "--allow-loopback"],
        ):
            assert cp.provision(*args).returncode == 0
        yield cp


def test_minion_run_joins_heartbeats_and_stops_on_sigterm(  # noqa: PLR0915
    tmp_path: Path,
    swtpm: Swtpm,
    tpm_vendor_ca: VendorCA,
    profile_inventory: Callable[[str], dict[str, Any]],
) -> None:
    inventory = profile_inventory("h100-sxm-server")
    inv_file = tmp_path / "inventory.json"
    inv_file.write_text(json.dumps(inventory))
    with region_lab(tmp_path, tpm_vendor_ca) as cp:
        state = tmp_path / "state"
        log = open(tmp_path / "minion.log", "w+")
        # systemd's side of the watchdog: the notify socket the image's unit (WatchdogSec=) hands the minion
        watchdog_dir = Path(tempfile.mkdtemp(prefix="rb-notify-"))  # short: a unix socket path has 108 bytes
        systemd = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        systemd.bind(str(watchdog_dir / "notify"))
        told: list[str] = []

        def read_notifications() -> None:  # as systemd does: read all along, or the queue fills
            with contextlib.suppress(OSError):
                while message := systemd.recv(4096):
                    told.append(message.decode())

        reader = threading.Thread(target=read_notifications, daemon=True)
        reader.start()
        proc = subprocess.Popen(
            [
                str(minion_executable()),
                "run",
                "--bundle",
                str(tmp_path / "bundle.json"),
                "--tcti",
                swtpm.tcti,
                "--state-dir",
                str(state),
                "--inventory",
                str(inv_file),
                "--heartbeat-interval",
                "0.2",
                "--max-backoff",
                "0.5",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={
                **os.environ,
                "TSS2_LOG": "all+none",
                "NOTIFY_SOCKET": str(watchdog_dir / "notify"),
                "WATCHDOG_USEC": "300000000",
            },
        )
        try:
            client = cp.client()
            pending = _wait(
                lambda: [p for p in client.get("/v1/pending-minions").json()["items"] if p["attested"]],
                "the minion to be attested and pending",
            )
            minion_id = pending[0]["minion_id"]
            assert pending[0]["attested"] and pending[0]["requirements"] == "pass", pending
            assert (
                cp.provision("node", "add", "gpu-1", "--region", "lab", "--minion-id", minion_id).returncode
                == 0
            )
            # the minion never finalizes this machine in place (not a rigbase node image: its actual
            # state says "refused"); report the node's finalize as its minion would on a node
            joined = _wait(
                lambda: (state / "node.json").exists() and json.loads((state / "node.json").read_text()),
                "node.json",
            )
            finish_finalize(client, joined["node_id"], joined["node_credential"])
            node = _wait(
                lambda: (
                    (n := client.get("/v1/nodes/gpu-1").json())["state"] == "maintenance"
                    and n["online"]
                    and n
                ),
                "the node to reach maintenance and report",
            )
            assert node["inventory"]["hostname"] == inventory["hostname"]
            _wait(
                lambda: json.loads((state / "status.json").read_text())["state"] == "maintenance",
                "status.json",
            )
            for name in ("ak.json", "node.json", "status.json"):
                assert (state / name).stat().st_mode & 0o777 == 0o600
            enrollment = BannerEnrollment(tmp_path, region="lab")
            text = render(
                minion_id=minion_id,
                tpm_problem=None,
                enrollment=enrollment,
                addresses=[],
                report=check(Inventory.from_json(inventory)),
                join_status=json.loads((state / "status.json").read_text()),
            )
            assert "join       maintenance" in text
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(15) == 0
            deadline = time.monotonic() + 5
            while (not told or told[-1] != "STOPPING=1") and time.monotonic() < deadline:
                time.sleep(0.05)
            # ready, pinged on every join attempt and heartbeat, stopping on purpose at SIGTERM
            assert told[0] == "READY=1" and told[-1] == "STOPPING=1", told
            assert told.count("WATCHDOG=1") >= 5, told
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            client.close()
            systemd.shutdown(socket.SHUT_RDWR)
            systemd.close()
            reader.join(5)
            shutil.rmtree(watchdog_dir, ignore_errors=True)
        log.seek(0)
        lines = log.read().splitlines()
    states = [line.split(":")[0] for line in lines]
    assert "pending" in states and "maintenance" in states and states[-1] == "stopped", lines
    assert states.count("pending") == 1, "state changes are printed once, not per attempt"


def test_minion_run_reads_ram_and_cores_from_host_root(
    tmp_path: Path,
    swtpm: Swtpm,
    tpm_vendor_ca: VendorCA,
    umockdev_testbed: Callable[[Any], Testbed],
) -> None:
    """A simulated node (the lab's): sysfs from umockdev, /proc from `--host-root`. Sizes no real machine
    here has, so the pending line can only have come from the supplied host root."""
    profile = load_profile("h100-sxm-server")
    profile["name"] = "odd-host"
    profile["host"] = {
        **profile["host"],
        "memory_gib": 1777,
        "sockets": 1,
        "cores_per_socket": 37,
        "threads_per_core": 1,
    }
    testbed = umockdev_testbed(profile)
    state = tmp_path / "state"
    env = {**os.environ, "TSS2_LOG": "all+none"}
    # an unusable --host-root is the operator's mistake: one line, exit 2, before any join attempt
    fake_bundle = tmp_path / "fake-bundle.json"
    fake_bundle.write_text(
        json.dumps(
            {
                "version": 1,
                "control_plane_url": "http://127.0.0.1:9",
                "join_token": "rbj_x",
                "region": "lab",
                "region_id": "reg_1",
                "provider": "physical",
            }
        )
    )
    (tmp_path / "empty").mkdir()
    bad = subprocess.run(
        testbed.command(
            str(minion_executable()),
            "run",
            "--bundle",
            str(fake_bundle),
            "--tcti",
            swtpm.tcti,
            "--state-dir",
            str(state),
            "--host-root",
            str(tmp_path / "empty"),
        ),
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert bad.returncode == 2 and "--host-root" in bad.stderr and bad.stderr.count("\n") == 1, bad
    assert not (state / "status.json").exists()
    with region_lab(tmp_path, tpm_vendor_ca) as cp:
        log = open(tmp_path / "minion.log", "w+")
        proc = subprocess.Popen(
            testbed.command(
                str(minion_executable()),
                "run",
                "--bundle",
                str(tmp_path / "bundle.json"),
                "--tcti",
                swtpm.tcti,
                "--state-dir",
                str(state),
                "--host-root",
                str(testbed.host_root),
                "--max-backoff",
                "0.5",
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        client = cp.client()
        try:
            pending = _wait(
                lambda: [p for p in client.get("/v1/pending-minions").json()["items"] if p["attested"]],
                "the minion to be attested and pending",
            )
            assert "37 cores" in pending[0]["inventory"] and "1777 GiB RAM" in pending[0]["inventory"], (
                pending
            )
            assert pending[0]["requirements"] == "pass", pending  # 1777 GiB ≥ 2 × 8 × 80 GB of VRAM
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(15) == 0
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # umockdev-run and the minion under it
                proc.wait()
            client.close()
            log.close()
