"""The control plane's SSH key reaching a node (docs/finalize.md "Real nodes over SSH"): a real `minion run`
/ `minion join` with a real swtpm against a real control plane. With `--authorized-keys PATH` the file
holds exactly the control plane's public key (0600, other lines kept, an old rigbase line replaced);
without it nothing is written anywhere. The heartbeat's observed address becomes the finalize SSH host."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from minion.tpm.session import TpmSession
from provisioner.adapters.ansible import SshTarget
from provisioner.lab.swtpm import Swtpm, VendorCA
from provisioner.reconcilers.finalize import target_for
from provisioner.settings import Settings
from provisioner.store.models import Node
from tests.fixtures.umockdev import minion_executable
from tests.minion.test_minion_run import _wait, region_lab

OTHER = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC7operator operator@laptop"
STALE = (
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIStaleStaleStaleStaleStaleStaleStaleStaleSt rigbase-control-plane"
)


def control_plane_key(home: Path) -> str:
    """The public line, derived here from the private key file the control plane wrote."""
    key = serialization.load_ssh_private_key((home / "ssh" / "id_ed25519").read_bytes(), password=None)
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return public.decode() + " rigbase-control-plane"


def _digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


def test_minion_run_installs_the_key_and_finalize_targets_the_observed_address(
    tmp_path: Path,
    swtpm: Swtpm,
    tpm_vendor_ca: VendorCA,
    profile_inventory: Callable[[str], dict[str, Any]],
) -> None:
    inventory = tmp_path / "inventory.json"
    inventory.write_text(json.dumps(profile_inventory("h100-sxm-server")))
    keys = tmp_path / "ssh" / "authorized_keys"
    keys.parent.mkdir(mode=0o700)
    keys.write_text(f"{OTHER}\n{STALE}\n")
    keys.chmod(0o644)
    with region_lab(tmp_path, tpm_vendor_ca) as cp:
        log = open(tmp_path / "minion.log", "w+")
        proc = subprocess.Popen(
            [
                str(minion_executable()),
                "run",
                "--bundle",
                str(tmp_path / "bundle.json"),
                "--tcti",
                swtpm.tcti,
                "--state-dir",
                str(tmp_path / "state"),
                "--inventory",
                str(inventory),
                "--heartbeat-interval",
                "0.2",
                "--max-backoff",
                "0.5",
                "--authorized-keys",
                str(keys),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "TSS2_LOG": "all+none"},
        )
        client = cp.client()
        try:
            pending = _wait(
                lambda: [p for p in client.get("/v1/pending-minions").json()["items"] if p["attested"]],
                "the minion to be attested and pending",
                timeout=60,
            )
            assert keys.read_text() == f"{OTHER}\n{STALE}\n", "nothing is written before a successful join"
            assert (
                cp.provision(
                    "node", "add", "gpu-1", "--region", "lab", "--minion-id", pending[0]["minion_id"]
                ).returncode
                == 0
            )
            node = _wait(
                lambda: (
                    (n := client.get("/v1/nodes/gpu-1").json())["state"] == "maintenance"
                    and n["online"]
                    and n
                ),
                "the node to join and heartbeat",
            )
            line = control_plane_key(cp.home)
            assert keys.read_text() == f"{OTHER}\n{line}\n"
            assert keys.stat().st_mode & 0o777 == 0o600
            assert (cp.home / "ssh" / "id_ed25519").stat().st_mode & 0o777 == 0o600
            assert (cp.home / "ssh").stat().st_mode & 0o777 == 0o700
            # The minion connected from loopback: that is the node's observed address, and the SSH host
            # finalize uses while the operator set no hostname.
            assert node["hostname"] is None and node["inventory"]["observed_address"] == "127.0.0.1", node
            with Session(create_engine(cp.database_url)) as session:
                stored = session.scalar(select(Node).where(Node.name == "gpu-1"))
                target = target_for(stored, Settings(home=cp.home).ssh_key_path)
            assert target == SshTarget(host="127.0.0.1", key_file=cp.home / "ssh" / "id_ed25519")
        finally:
            client.close()
            proc.send_signal(signal.SIGTERM)
            try:
                stopped = proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                stopped = proc.wait()
            log.seek(0)
            output = log.read()
            log.close()
    assert stopped == 0 and "warning" not in output, output


def test_minion_join_writes_nothing_without_the_option_and_is_idempotent_with_it(
    tmp_path: Path,
    swtpm: Swtpm,
    tpm_vendor_ca: VendorCA,
    profile_inventory: Callable[[str], dict[str, Any]],
) -> None:
    inventory = tmp_path / "inventory.json"
    inventory.write_text(json.dumps(profile_inventory("h100-sxm-server")))
    home = tmp_path / "user-home"
    home.mkdir()
    root_keys = Path("/root/.ssh/authorized_keys")
    before = _digest(root_keys)
    with TpmSession(swtpm.tcti) as session:
        minion_id = session.endorsement_key().minion_id
    env = {**os.environ, "TSS2_LOG": "all+none", "HOME": str(home)}

    def join(*extra: str) -> dict[str, Any]:
        out = subprocess.run(
            [
                str(minion_executable()),
                "join",
                "--bundle",
                str(tmp_path / "bundle.json"),
                "--tcti",
                swtpm.tcti,
                "--state-dir",
                str(tmp_path / "state"),
                "--inventory",
                str(inventory),
                "--json",
                *extra,
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert out.returncode == 0, out
        return json.loads(out.stdout)

    with region_lab(tmp_path, tpm_vendor_ca) as cp:
        assert (
            cp.provision("node", "add", "gpu-2", "--region", "lab", "--minion-id", minion_id).returncode == 0
        )
        outside = {"home", "state", "swtpm"}  # the server's home, the minion's state dir, the TPM's files

        def files() -> list[str]:
            return sorted(
                str(p) for p in tmp_path.rglob("*") if p.relative_to(tmp_path).parts[0] not in outside
            )

        listed = files()
        first = join()
        line = control_plane_key(cp.home)
        assert first["state"] == "joined" and first["node"]["ssh_authorized_key"] == line, first
        assert not (home / ".ssh").exists() and _digest(root_keys) == before and files() == listed
        keys = tmp_path / "new" / ".ssh" / "authorized_keys"
        for _ in range(2):  # a second join leaves exactly one line
            assert join("--authorized-keys", str(keys))["state"] == "joined"
            assert keys.read_text() == f"{line}\n"
            assert keys.stat().st_mode & 0o777 == 0o600 and keys.parent.stat().st_mode & 0o777 == 0o700
        assert control_plane_key(cp.home) == line, "the key pair is reused, not re-created per join"
