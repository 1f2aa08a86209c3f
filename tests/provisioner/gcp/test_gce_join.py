"""A real minion joins as the GCP storage node's VM (issue 13): a real `provision serve` with the GCP fakes
and the Cloud Storage emulator; the region created and its image published with the real `provision`
CLI; the Compute fake gives the VM the EK of a real swtpm (whose PCR 4 holds the boot path its event log
describes); a loopback metadata server serves that VM's metadata as Compute holds it; and the real
`minion gce-bundle` then `minion join` do what the GCE image's units do at boot. The VM's pinned EK is
the minion's: it joins as that node, with attestation, over TLS pinned to the bundle's CA."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization

from minion.tpm.session import TpmSession
from provisioner.lab.swtpm import Swtpm, VendorCA
from tests.fixtures.control_plane import start_control_plane
from tests.fixtures.eventlog import boot_path_events, extend_digests, write_event_log
from tests.fixtures.gce_metadata import Instance, metadata_server
from tests.fixtures.swtpm import _started_copy
from tests.fixtures.umockdev import minion_executable
from tests.provisioner.gcp.test_control_plane import (  # the walkthrough's helpers
    enable,
    ok,
    publish,
    show,
    show_gcp,
    until,
)

PE_HASHES = {"systemd-boot": "5b" * 32, "uki": "6c" * 32, "kernel": "7d" * 32}


def minion(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(minion_executable()), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "TSS2_LOG": "all+none", **env},
        timeout=180,
        check=False,
    )


def test_a_minion_joins_as_the_storage_vm_with_the_bundle_from_its_metadata(
    gcp_world: dict[str, Any],
    key_file: Path,
    tmp_path: Path,
    gce_archive: Path,
    tpm_vendor_ca: VendorCA,
    _golden_swtpm: Callable[[VendorCA, int], Swtpm],
    profile_inventory: Callable[[str], dict[str, Any]],
) -> None:
    fake, prefix = gcp_world["compute"], gcp_world["prefix"]
    tpm = _started_copy(_golden_swtpm(tpm_vendor_ca, 0), tmp_path / "vtpm")
    try:
        with TpmSession(tpm.tcti) as session:
            extend_digests(session, boot_path_events(list(PE_HASHES.values())))  # what the firmware ran
            ek = session.endorsement_key()
        key = serialization.load_der_public_key(ek.spki_der)
        fake.next_ek_pems.append(
            key.public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            ).decode()
        )
        inventory = tmp_path / "inventory.json"
        inventory.write_text(json.dumps(profile_inventory("h100-sxm-server")))
        with start_control_plane(tmp_path / "home", fakes=gcp_world["fakes"]) as cp:
            enable(cp, key_file, prefix)
            ok(cp, "region", "create", "us-central1", "--provider", "gcp", "--storage-class", "small")
            publish(cp, tmp_path, gce_archive, pe_hashes=PE_HASHES)
            until("storage VM ready", lambda: show_gcp(cp)["vm"]["status"] == "ready", timeout=60)
            vm = show_gcp(cp)["vm"]
            name = f"{prefix}-storage-us-central1"
            node = show(cp, "node", name)
            assert node["minion_id"] == ek.minion_id  # the VM's pinned EK is this TPM's
            inst = fake.instances[(vm["zone"], name)]
            attributes = {item["key"]: item["value"] for item in inst["metadata"]["items"]}

            # rigbase-gce-bundle.service: the bundle from the metadata server onto the state partition
            state = tmp_path / "var-lib-rigbase"
            with metadata_server(Instance(attributes)) as host:
                got = minion(
                    "gce-bundle", "--output", str(state / "bundle.json"), env={"GCE_METADATA_HOST": host}
                )
            assert got.returncode == 0, got.stderr
            bundle = json.loads((state / "bundle.json").read_text())
            assert bundle["control_plane_url"] == cp.url and bundle["ca_certificate"]
            # rigbase-minion-gce.service: join with it (one attempt here; `minion run` loops the same)
            log = tmp_path / "binary_bios_measurements"
            log.write_bytes(write_event_log(boot_path_events(list(PE_HASHES.values()))))
            joined = minion(
                "join",
                "--bundle",
                str(state / "bundle.json"),
                "--tcti",
                tpm.tcti,
                "--state-dir",
                str(state / "minion"),
                "--inventory",
                str(inventory),
                "--json",
                env={"RIGBASE_EVENT_LOG": str(log)},
            )
            assert joined.returncode == 0, joined.stdout + joined.stderr
            outcome = json.loads(joined.stdout)
            assert outcome["state"] == "joined", outcome
            node = show(cp, "node", name)
            assert node["state"] not in ("new", "errored") and node["identity"].startswith("tpm"), node
    finally:
        tpm.remove()
