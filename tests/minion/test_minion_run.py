"""`minion run` as the lab and the systemd unit run it: a real process with a real swtpm against a real
control plane — pending until the operator adds the node, then joined, heartbeating, state files 0600,
the banner showing the join state, and a clean exit on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from minion.banner import Enrollment, render
from minion.hardware.model import Inventory
from minion.hardware.requirements import check
from provisioner.lab.swtpm import Swtpm, VendorCA
from tests.fixtures.control_plane import start_control_plane
from tests.fixtures.umockdev import minion_executable


def _wait(predicate: Callable[[], Any], what: str, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_minion_run_joins_heartbeats_and_stops_on_sigterm(
    tmp_path: Path, swtpm: Swtpm, tpm_vendor_ca: VendorCA, profile_inventory: Callable[[str], dict[str, Any]],
) -> None:
    inventory = profile_inventory("h100-sxm-server")
    inv_file = tmp_path / "inventory.json"
    inv_file.write_text(json.dumps(inventory))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RIGBASE_FINALIZE", "skip")
        with start_control_plane(tmp_path / "home") as cp:
            ca = tmp_path / "vendor.pem"
            ca.write_bytes(b"".join(tpm_vendor_ca.certificate_pems()))
            for args in (["provider", "enable", "physical"], ["region", "create", "lab", "--provider", "physical"],
                         ["tpm-ca", "add", str(ca)], ["region", "bundle", "lab", "-o", str(tmp_path / "bundle.json")]):
                assert cp.provision(*args).returncode == 0
            state = tmp_path / "state"
            log = open(tmp_path / "minion.log", "w+")
            proc = subprocess.Popen([str(minion_executable()), "run", "--bundle", str(tmp_path / "bundle.json"),
                                     "--tcti", swtpm.tcti, "--state-dir", str(state), "--inventory", str(inv_file),
                                     "--heartbeat-interval", "0.2", "--max-backoff", "0.5"],
                                    stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "TSS2_LOG": "all+none"})
            try:
                client = cp.client()
                pending = _wait(lambda: [p for p in client.get("/v1/pending-minions").json()["items"] if p["attested"]],
                                "the minion to be attested and pending")
                minion_id = pending[0]["minion_id"]
                assert pending[0]["attested"] and pending[0]["requirements"] == "pass", pending
                assert cp.provision("node", "add", "gpu-1", "--region", "lab", "--minion-id", minion_id).returncode == 0
                node = _wait(lambda: (n := client.get("/v1/nodes/gpu-1").json())["state"] == "maintenance" and n["online"] and n,
                             "the node to reach maintenance and report")
                assert node["inventory"]["hostname"] == inventory["hostname"]
                _wait(lambda: json.loads((state / "status.json").read_text())["state"] == "maintenance", "status.json")
                for name in ("ak.json", "node.json", "status.json"):
                    assert (state / name).stat().st_mode & 0o777 == 0o600
                text = render(minion_id=minion_id, tpm_problem=None, enrollment=Enrollment(tmp_path, region="lab"),
                              addresses=[], report=check(Inventory.from_json(inventory)),
                              join_status=json.loads((state / "status.json").read_text()))
                assert "join       maintenance" in text
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(15) == 0
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                client.close()
            log.seek(0)
            lines = log.read().splitlines()
    states = [line.split(":")[0] for line in lines]
    assert "pending" in states and "maintenance" in states and states[-1] == "stopped", lines
    assert states.count("pending") == 1, "state changes are printed once, not per attempt"
