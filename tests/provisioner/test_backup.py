"""Backup and restore of a running control plane: a node joins with a real swtpm, `provision backup` runs
while the server serves, the home is destroyed, `provision restore` fills a new empty home, and the restored
server accepts the same node's heartbeats with the same credential — no re-enrolment. Wrong passphrases,
non-empty homes and foreign files are one-line refusals that write nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx

from provisioner.lab.swtpm import VendorCA
from tests.fixtures.control_plane import PROVISION, ControlPlane, start_control_plane
from tests.provisioner.test_join_http import Minion, api, token

PASSPHRASE = "correct horse battery staple"


def _provision(home: Path, *args: str, passphrase: str = PASSPHRASE) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RIGBASE_HOME": str(home), "RIGBASE_BACKUP_PASSPHRASE": passphrase}
    env.pop("RIGBASE_DATABASE_URL", None)
    return subprocess.run([str(PROVISION), *args], env=env, capture_output=True, text=True, timeout=120)


def _joined(cp: ControlPlane, minion: Minion, vendor: VendorCA) -> dict[str, Any]:
    api(cp, "POST", "/v1/providers", {"kind": "physical", "config": {}})
    api(cp, "POST", "/v1/regions", {"name": "lab", "provider": "physical"})
    api(cp, "POST", "/v1/tpm-cas", {"pem": b"".join(vendor.certificate_pems()).decode()})
    api(cp, "POST", "/v1/nodes", {"name": "gpu-1", "region": "lab", "minion_id": minion.minion_id})
    joined = minion.join(token(cp))
    assert joined.status_code == 200, joined.text
    return joined.json()


def test_backup_a_running_control_plane_destroy_restore_and_the_node_carries_on(
    tmp_path: Path, make_swtpm: Any, tpm_vendor_ca: VendorCA
) -> None:
    home, backup = tmp_path / "home", tmp_path / "rigbase.backup"
    with start_control_plane(home) as cp:
        minion = Minion(make_swtpm(), cp.url)
        try:
            node = _joined(cp, minion, tpm_vendor_ca)
            assert minion.beat(node).status_code == 200
            made = _provision(home, "backup", "-o", str(backup), "--json")  # while serving
            assert made.returncode == 0, made.stderr
            summary = json.loads(made.stdout)
            assert summary["store"] == "sqlite" and {"rigbase.db", "client.json"} <= set(summary["members"])
            assert backup.stat().st_mode & 0o777 == 0o600
            assert b"rbo_" not in backup.read_bytes() and b"SQLite" not in backup.read_bytes()  # encrypted
            before = api(cp, "GET", "/v1/nodes/gpu-1")
        finally:
            minion.http.close()
    shutil.rmtree(home)

    restored = tmp_path / "restored"
    wrong = _provision(restored, "restore", str(backup), passphrase="not the passphrase at all")
    assert wrong.returncode == 2 and wrong.stderr.count("\n") == 1 and "wrong passphrase" in wrong.stderr
    assert not restored.exists() or not any(restored.iterdir())
    foreign = tmp_path / "foreign.backup"
    foreign.write_bytes(b"PK\x03\x04 not a backup")
    out = _provision(restored, "restore", str(foreign))
    assert out.returncode == 2 and "not a rigbase backup" in out.stderr
    ok = _provision(restored, "restore", str(backup))
    assert ok.returncode == 0, ok.stderr
    again = _provision(restored, "restore", str(backup))
    assert again.returncode == 1 and "not empty" in again.stderr and again.stderr.count("\n") == 1
    assert all(f.stat().st_mode & 0o777 == 0o600 for f in restored.rglob("*") if f.is_file())

    with start_control_plane(restored) as cp:
        minion.http = httpx.Client(base_url=cp.url, timeout=30)  # the restored server's new port
        after = api(cp, "GET", "/v1/nodes/gpu-1")
        assert after["id"] == before["id"] and after["minion_id"] == before["minion_id"]
        beat = minion.beat(node)  # the same node credential, no new join
        assert beat.status_code == 200 and beat.json()["node_id"] == node["node_id"], beat.text
        history = api(cp, "GET", "/v1/nodes/gpu-1/history")["items"]
        assert sum(1 for e in history if e.get("to_state") == "provisioning") == 1
    minion.session.close()
