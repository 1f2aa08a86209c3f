"""A real minion joins as a VM rigbase made in GCP: a real `provision serve` with the GCP fakes
and the Cloud Storage emulator; the region created, its image published and a job created with the real
`provision` CLI; the Compute fake gives the VM the EK of a real swtpm (whose PCR 4 holds the boot path its
event log describes); a loopback metadata server serves that VM's metadata as Compute holds it; and the
real `minion gce-bundle` then `minion join` do what the GCE image's units do at boot. The VM's pinned EK
is the minion's: it joins as that node, with attestation, over TLS pinned to the bundle's CA."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization

from minion.tpm.session import TpmSession
from provisioner.lab.swtpm import Swtpm, VendorCA
from tests.fixtures.control_plane import ControlPlane, start_control_plane
from tests.fixtures.eventlog import boot_path_events, extend_digests, write_event_log
from tests.fixtures.gce_metadata import Instance, metadata_server
from tests.fixtures.swtpm import _started_copy
from tests.fixtures.umockdev import minion_executable
from tests.provisioner.gcp.fake_compute import new_ek_pem
from tests.provisioner.gcp.test_control_plane import (  # the walkthrough's helpers
    enable,
    ok,
    publish,
    show,
    show_gcp,
    until,
)

PE_HASHES = {"systemd-boot": "5b" * 32, "uki": "6c" * 32, "kernel": "7d" * 32}


def minion(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(minion_executable()), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "TSS2_LOG": "all+none", **(env or {})},
        timeout=180,
        check=False,
    )


class Vm:
    """The VM's side: its vTPM (a swtpm booted through PE_HASHES), firmware log and state partition."""

    def __init__(self, tpm: Swtpm, directory: Path, inventory: dict[str, Any]) -> None:
        self.tpm, self.state = tpm, directory / "var-lib-rigbase"
        with TpmSession(tpm.tcti) as session:
            extend_digests(session, boot_path_events(list(PE_HASHES.values())))  # what the firmware ran
            self.ek = session.endorsement_key()
        self.log = directory / "binary_bios_measurements"
        self.log.write_bytes(write_event_log(boot_path_events(list(PE_HASHES.values()))))
        self.inventory = directory / "inventory.json"
        self.inventory.write_text(json.dumps(inventory))

    def ek_pem(self) -> str:
        key = serialization.load_der_public_key(self.ek.spki_der)
        pem = key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        return pem.decode()

    def boot(self, instance: dict[str, Any]) -> dict[str, Any]:
        """rigbase-gce-bundle.service, then one join of rigbase-minion-gce.service; the outcome."""
        attributes = {item["key"]: item["value"] for item in instance["metadata"]["items"]}
        with metadata_server(Instance(attributes)) as host:
            got = minion(
                "gce-bundle", "--output", str(self.state / "bundle.json"), env={"GCE_METADATA_HOST": host}
            )
        assert got.returncode == 0, got.stderr
        joined = minion(
            "join",
            "--bundle",
            str(self.state / "bundle.json"),
            "--tcti",
            self.tpm.tcti,
            "--state-dir",
            str(self.state / "minion"),
            "--inventory",
            str(self.inventory),
            "--json",
            env={"RIGBASE_EVENT_LOG": str(self.log)},
        )
        assert joined.returncode == 0, joined.stdout + joined.stderr
        outcome: dict[str, Any] = json.loads(joined.stdout)
        return outcome

    def credential(self) -> dict[str, Any]:
        saved: dict[str, Any] = json.loads((self.state / "minion" / "node.json").read_text())
        return saved


@pytest.fixture()
def vm(
    tmp_path: Path,
    tpm_vendor_ca: VendorCA,
    _golden_swtpm: Callable[[VendorCA, int], Swtpm],
    profile_inventory: Callable[[str], dict[str, Any]],
) -> Iterator[Vm]:
    tpm = _started_copy(_golden_swtpm(tpm_vendor_ca, 0), tmp_path / "vtpm")
    try:
        yield Vm(tpm, tmp_path, profile_inventory("h100-sxm-server"))
    finally:
        tpm.remove()


def gcp_region(
    cp: ControlPlane, world: dict[str, Any], key_file: Path, tmp_path: Path, archive: Path
) -> None:
    """Provider enabled, region us-central1 created, its image published (the operator's steps)."""
    enable(cp, key_file, world["prefix"])
    ok(cp, "region", "create", "us-central1", "--provider", "gcp", "--storage-class", "small")
    publish(cp, tmp_path, archive, pe_hashes=PE_HASHES)
    until("storage VM ready", lambda: show_gcp(cp)["vm"]["status"] == "ready", timeout=60)


def test_a_minion_joins_as_the_storage_vm_with_the_bundle_from_its_metadata(
    gcp_world: dict[str, Any], key_file: Path, tmp_path: Path, gce_archive: Path, vm: Vm
) -> None:
    fake, prefix = gcp_world["compute"], gcp_world["prefix"]
    fake.next_ek_pems.append(vm.ek_pem())
    with start_control_plane(tmp_path / "home", fakes=gcp_world["fakes"]) as cp:
        gcp_region(cp, gcp_world, key_file, tmp_path, gce_archive)
        name = f"{prefix}-storage-us-central1"
        assert show(cp, "node", name)["minion_id"] == vm.ek.minion_id  # the VM's pinned EK is this TPM's
        outcome = vm.boot(fake.instances[(show_gcp(cp)["vm"]["zone"], name)])
        assert outcome["state"] == "joined", outcome
        bundle = json.loads((vm.state / "bundle.json").read_text())
        assert bundle["control_plane_url"] == cp.url and bundle["ca_certificate"]
        node = show(cp, "node", name)
        assert node["state"] not in ("new", "errored") and node["identity"].startswith("tpm"), node


def test_a_job_no_owned_node_fits_gets_a_vm_whose_minion_joins_runs_it_and_the_vm_goes_after(
    gcp_world: dict[str, Any], key_file: Path, tmp_path: Path, gce_archive: Path, vm: Vm
) -> None:
    fake = gcp_world["compute"]
    fake.next_ek_pems.extend([new_ek_pem(), vm.ek_pem()])  # the storage VM's, then the burst VM's
    job_file = tmp_path / "job.yaml"
    job_file.write_text(
        json.dumps(
            {
                "name": "burst-train",
                "type": "training",
                "resources": {"gpu_count": 1, "gpu_types": ["V100"]},
                "workers": ["python train.py"],
                "environment": {"image": "localhost/rigbase-job:test"},
            }
        )
    )
    with start_control_plane(tmp_path / "home", fakes=gcp_world["fakes"]) as cp:
        gcp_region(cp, gcp_world, key_file, tmp_path, gce_archive)
        job_id = ok(cp, "job", "create", "-f", str(job_file), "--yes").stdout.strip()

        def burst_node() -> dict[str, Any] | None:
            with cp.client() as client:
                job = client.get(f"/v1/jobs/{job_id}").json()
            node_id = (job.get("workers") or [{}])[0].get("node_id")
            if not node_id:
                return None
            node = show(cp, "node", node_id)
            return node if node.get("minion_id") == vm.ek.minion_id else None  # its EK pinned

        node = until("the burst VM made and its EK pinned", burst_node, timeout=60)
        (inst,) = [i for (z, n), i in fake.instances.items() if n == node["name"]]
        assert inst["machineType"].endswith("/machineTypes/n1-standard-8")
        assert inst["guestAccelerators"][0]["acceleratorType"].endswith("/nvidia-tesla-v100")
        assert inst["labels"]["rigbase-job"] == job_id
        assert next(d for d in inst["disks"] if d.get("boot"))["initializeParams"]["sourceImage"].endswith(
            f"/images/family/{gcp_world['prefix']}-us-central1"
        )
        outcome = vm.boot(inst)
        assert outcome["state"] == "joined" and outcome["node"]["node_id"] == node["id"], outcome
        # its first heartbeat's desired state carries the job's worker
        saved = vm.credential()

        def beat(actual: dict[str, Any]) -> dict[str, Any]:
            with cp.client() as client:
                answer = client.post(
                    f"/v1/nodes/{saved['node_id']}/heartbeat",
                    json={"actual": actual},
                    headers={"Authorization": f"Bearer {saved['node_credential']}"},
                )
            assert answer.status_code == 200, answer.text
            return dict(answer.json())

        workers = beat({})["desired"]["jobs"]["workers"]
        assert [(w["job_id"], w["worker"], w["command"]) for w in workers] == [(job_id, 0, "python train.py")]
        # the worker runs and exits 0 (what the minion reports of its podman container: the lab runs real
        # containers, tests/provisioner/test_lab_jobs.py); the job ends and the VM goes with it
        report = {"job_id": job_id, "worker": 0, "generation": workers[0]["generation"]}
        beat({"jobs": {"workers": [{**report, "state": "running"}]}})
        beat({"jobs": {"workers": [{**report, "state": "exited", "exit_code": 0, "log_eof": True}]}})
        until("the job succeeded", lambda: show(cp, "job", job_id)["state"] == "succeeded", timeout=30)
        until("the VM deleted", lambda: all(n != node["name"] for _z, n in fake.instances), timeout=60)
        assert show(cp, "node", node["id"]).get("state") in (None, "removed")
