"""A node's whole life from the boot media, in one QEMU VM (TCG, OVMF, swtpm with an EK certificate from
the test's vendor CA), against a real `provision serve` on loopback over TLS:

1. region `vm` (central storage), an image built from its bundle, its manifest registered;
2. the VM boots the USB image beside a 2 GiB NVMe for the OS, two sparse NVMe cache drives and three sparse
   SATA drives; its only network is QEMU user networking with `restrict=on` and one `guestfwd` to the
   control plane's port, on a virtio NIC that reports 10 GbE;
3. 'yes', install, reboot: the installed OS boots from NVMe (its root a verbatim copy of the drive's), the
   banner shows the minion_id computed here from the swtpm's EK, PCR 11, PCR 12 and the PCR 4 event-log
   replay equal the signed manifest; the minion shows up in `provision node pending`;
4. `provision node add store-1 --service storage --wait`: the node runs its own finalize playbook (md RAID0
   of the two cache drives, ext4, NFS export) and ends active — no connection from the control plane;
5. a reset the guest did not ask for (`system_reset`): the node boots the installed OS again, re-applies its
   saved configuration, heartbeats with the same credential, passes a fresh quote, and reports /scratch
   mounted from the same array and the export back; powered off and started without its USB drive, it
   stops at a clear message;
6. a GCE VM (the image's GCE target on virtio-scsi, GCE's DMI name, a metadata server behind a guestfwd)
   grows its state partition, reads its bundle from the metadata server and joins (pending, attested);
   with its UKI modified on the boot disk it is refused at join, with its refusal kind in `provision node
   refusals`.

One QEMU at a time (shared 2-core hosts); the whole test takes about the time docs/testing.md states."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from image_builder import build, manifest, pe, vm
from image_builder.plan import BuildConfig
from provisioner.lab.swtpm import Swtpm, VendorCA, create_vendor_ca, provision_swtpm
from tests.fixtures.control_plane import PROVISION, ControlPlane, start_control_plane
from tests.image_builder import measured
from tests.image_builder.conftest import _cache_dir

# The whole test's bound, over the waits' own (each fails with the console's tail). On TCG beside other work
# the storage node's life has taken up to 43 min; 50 min keeps a sixth above that. It runs as `make test-vm`.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3000)]

GiB = 2**30
GUEST_CP = "10.0.2.100"  # QEMU's guestfwd address for the control plane (image_builder.vm)
EPOCH = 1700000000


def _run(cp: ControlPlane, *args: str, rc: int = 0) -> str:
    out = cp.provision(*args)
    assert out.returncode == rc, (
        f"provision {' '.join(args)}: rc {out.returncode}\n{out.stdout}\n{out.stderr}"
    )
    return out.stdout


def _json(cp: ControlPlane, *args: str) -> Any:
    return json.loads(_run(cp, *args, "--json"))


def _get(cp: ControlPlane, path: str, **params: str) -> Any:
    """The API's answer, as `provision ... --json` prints it. The polls below use this, not the CLI: a CLI
    process every 2 s for half an hour took most of a core from the guest and the rest of the suite."""
    with cp.client() as client:
        answer = client.get(path, params=params)
        answer.raise_for_status()
        return answer.json()


def _until(what: str, timeout: float, probe: Any, m: vm.Machine | None = None) -> Any:
    """Poll `probe()` until it returns something truthy; on timeout fail with the console's tail."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(2)
    # the last 60 lines, each cut to 200 characters: the firmware's event log dump is one very long line
    lines = m.text().splitlines()[-60:] if m is not None else []
    tail = "\n".join(ln[:200] for ln in lines)
    raise AssertionError(f"{what} did not happen within {timeout:.0f} s; console tail:\n{tail}")


@pytest.fixture(scope="module")
def vendor(tmp_path_factory: pytest.TempPathFactory) -> VendorCA:
    return create_vendor_ca(tmp_path_factory.mktemp("vm-vendor-ca") / "ca")


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory, vendor: VendorCA) -> Iterator[ControlPlane]:
    home = tmp_path_factory.mktemp("vm-cp") / "home"
    # short beats and a quote every 3rd: the reset's fresh quote within a minute, not five
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RIGBASE_HEARTBEAT_S", "5")
        mp.setenv("RIGBASE_QUOTE_EVERY", "3")
        started = start_control_plane(home, advertise=("127.0.0.1", GUEST_CP, vm.GCE_CONTROL_PLANE))
        server = started.__enter__()
    try:
        _run(server, "provider", "enable", "physical")
        _run(server, "region", "create", "vm", "--provider", "physical", "--storage-mode", "central")
        for pem in (vendor.root_certificate, vendor.intermediate_certificate):
            _run(server, "tpm-ca", "add", str(pem))
        yield server
    finally:
        started.__exit__(None, None, None)


@pytest.fixture(scope="module")
def image(cp: ControlPlane, tmp_path_factory: pytest.TempPathFactory, source_snapshot: Path) -> Path:
    """The region's boot media, built from its bundle, its builder key trusted and its manifest registered."""
    d = tmp_path_factory.mktemp("vm-image")
    bundle = d / "bundle.json"
    _run(cp, "region", "bundle", "vm", "-o", str(bundle), "--control-plane-url", f"https://{GUEST_CP}:8470")
    assert json.loads(bundle.read_text())["ca_certificate"], "the bundle must pin the control plane's CA"
    priv, pub = manifest.keygen(d / "builder.pem")
    cache = _cache_dir()
    build.build(
        BuildConfig(
            bundle=bundle,
            output=d / "out",
            cache=cache,
            key=priv,
            source_date_epoch=EPOCH,
            repo=source_snapshot,
            targets=("usb", "gce"),
        ),
        log=lambda _m: None,
    )
    _run(cp, "image", "trust-key", str(pub), "--name", "vm-test")
    _run(cp, "image", "register", str(d / "out" / "manifest.json"))
    return d / "out"


def _machine(
    workdir: Path, usb: Path, tpm: Swtpm, cp: ControlPlane, disks: dict[str, list[Path]]
) -> vm.Machine:
    return vm.Machine(
        workdir,
        usb,
        disks["nvme"],
        tpm.state_dir,
        sata_images=disks["sata"],
        control_plane_port=int(cp.url.rsplit(":", 1)[1].rstrip("/")),
    )


def _disks(d: Path) -> dict[str, list[Path]]:
    d.mkdir(parents=True, exist_ok=True)
    return {
        # sparse: central storage mode's storage node needs >= 1 TB of NVMe (docs/hardware.md); only what the
        # guest writes takes space on the host
        "nvme": [vm.blank_disk(d / "nvme0.img", 2 * GiB)]
        + [vm.blank_disk(d / f"cache{i}.img", 600 * GiB) for i in (1, 2)],
        "sata": [vm.blank_disk(d / f"sata{i}.img", 2 * GiB) for i in range(3)],
    }


def _install(m: vm.Machine) -> int:
    m.wait_for(r"Type 'yes' to ERASE", 420)
    m.send("yes\n")
    mark = len(m.output)
    m.wait_for(r"installed; rebooting", 900, mark)
    return mark


def _node(cp: ControlPlane, name: str) -> dict[str, Any]:
    node: dict[str, Any] = _get(cp, f"/v1/nodes/{name}", region="vm")
    return node


def _serving(cp: ControlPlane) -> dict[str, Any] | None:
    """The live report once /scratch is mounted from an array and something is exported, else None."""
    live = _live(cp)
    mounted = live["mounts"].get("/scratch") or ""
    return live if mounted.startswith("/dev/md") and live["exports"] else None


def _live(cp: ControlPlane) -> dict[str, Any]:
    """What the storage node's minion reports is mounted and exported right now."""
    reported = _node(cp, "store-1").get("finalize_actual") or {}
    return reported.get("live") or {"mounts": {}, "exports": []}


def test_storage_node_life_from_usb_to_active_and_through_a_reset(
    cp: ControlPlane, image: Path, vendor: VendorCA, tmp_path: Path
) -> None:
    tpm = provision_swtpm(tmp_path / "tpm", vendor)
    expected_id = vm.minion_id_from_ek_cert(tpm.ek_certificate.read_bytes())
    disks = _disks(tmp_path / "disks")
    usb = image / "rigbase-usb.img"
    doc = json.loads((image / "manifest.json").read_bytes())
    with _machine(tmp_path / "vm", usb, tpm, cp, disks) as m:
        mark = _install(m)
        m.through_firmware(mark)
        shown = m.wait_for(r"(?:MINION_ID=|minion_id +)([0-9a-f]{32})", 600, mark)  # as after the reset below
        assert shown.group(1) == expected_id
        # The installed OS booted (from NVMe) and measured what the signed manifest says it would.
        m.wait_for(measured.EVENTLOG_LINE, 420, mark)
        assert "RIGBASE-BOOT-SOURCE=nvme" in m.text(mark)
        measured.assert_measured_as_signed(m.text(mark), doc)
        _assert_installed_root_is_the_usb_root(usb, disks["nvme"][0], doc)

        # The minion reaches the control plane through the guestfwd (TLS, pinned CA) and waits, attested.
        def pending() -> bool:
            rows = [p for p in _get(cp, "/v1/pending-minions")["items"] if p["minion_id"] == expected_id]
            assert not rows or rows[0]["requirements"] == "pass", rows  # a refusal: stop at once
            return bool(rows)

        _until("the minion showing up in `provision node pending`", 600, pending, m)

        # Adopt it as the region's storage node: it finalizes itself and enters active.
        added = subprocess.run(
            [str(PROVISION), "node", "add", "store-1", "--region", "vm", "--minion-id", expected_id,
             "--service", "storage", "--wait", "--timeout", "1500", "--json"],
            env=cp.env, capture_output=True, text=True, timeout=1600,
        )  # fmt: skip
        node = _node(cp, "store-1")
        assert added.returncode == 0 and node["state"] == "active", (added.stderr, node, m.text()[-3000:])
        history = " / ".join(e.get("reason") or "" for e in _json(cp, "node", "history", "store-1"))
        assert "task" in history and "finalized in" in history, history
        assert "ssh" not in history.lower()
        # the minion's next heartbeats report what the run left mounted and exported
        live = _until("the minion reporting /scratch and the export", 180, lambda: _serving(cp), m)
        scratch = live["mounts"]["/scratch"]
        assert scratch.startswith("/dev/md"), live
        # A reset the guest did not ask for: it boots the installed OS again from the same disks.
        reset_at = datetime.now(UTC)
        mark = len(m.output)
        m.system_reset()
        m.through_firmware(mark)
        m.wait_for(r"(?:MINION_ID=|minion_id +)" + expected_id, 600, mark)

        def after_reset(stamp: str | None) -> bool:
            return stamp is not None and datetime.fromisoformat(stamp) > reset_at

        def back() -> dict[str, Any] | None:
            n = _node(cp, "store-1")
            fresh = after_reset(n["last_heartbeat_at"]) and after_reset(n.get("last_quote_at"))
            return n if fresh and _serving(cp) else None  # a report sent after the reset

        again = _until("heartbeats, a fresh quote, /scratch and the export after the reset", 1200, back, m)
        assert again["state"] == "active" and again["id"] == node["id"]
        assert _live(cp)["exports"] == live["exports"]
        # No re-enrolment: the node entered provisioning once (task lines stay in provisioning).
        events = _json(cp, "node", "history", "store-1")
        joins = [
            e for e in events if e.get("to_state") == "provisioning" and e.get("from_state") != "provisioning"
        ]
        assert len(joins) == 1, joins
        # The console shows the node serving again: the minion's state line after the reset.
        m.wait_for(r"minion\[\d+\]: active", 300, mark)
        # and nothing failed on the way up (podman's own units stay off: only the minion runs containers)
        failed = [line for line in m.text(mark).splitlines() if "Failed to start" in line]
        assert not failed, failed
    # Without the USB drive the node stops at a clear message (the NVMe ESP's only entry).
    with vm.Machine(tmp_path / "vm-nousb", None, disks["nvme"][:1], tpm.state_dir) as m:
        m.wait_for(r"USB boot drive is missing", 180)


def _assert_installed_root_is_the_usb_root(usb: Path, nvme: Path, doc: dict[str, Any]) -> None:
    """The installed OS on NVMe is a verbatim copy of the USB drive's verity-protected root."""
    listing = subprocess.run(["sfdisk", "--json", str(nvme)], capture_output=True, text=True, check=True)
    by_name = {p["name"]: p for p in json.loads(listing.stdout)["partitiontable"]["partitions"]}
    usb_root = doc["image"]["partitions"]["rigbase-usb-root"]
    with usb.open("rb") as u, nvme.open("rb") as n:
        u.seek(usb_root["offset"])
        n.seek(by_name["rigbase-os-root"]["start"] * 512)
        assert u.read(8 * 2**20) == n.read(8 * 2**20)


def _modified_uki(image: Path, into: Path) -> Path:
    """The build's UKI with one byte of its .osrel changed: another PCR 11, another Authenticode digest."""
    uki = bytearray((image / "rigbase.efi").read_bytes())
    osrel = pe.section(bytes(uki), ".osrel")
    at = bytes(uki).index(osrel) + osrel.index(b"rigbase node")
    uki[at : at + 12] = b"RIGBASE NODE"
    into.write_bytes(bytes(uki))
    return into


def test_a_gce_vm_reads_its_bundle_from_metadata_joins_and_with_a_modified_uki_is_refused(
    cp: ControlPlane, image: Path, vendor: VendorCA, tmp_path: Path
) -> None:
    """The GCE target booted as Compute Engine boots it: disk.raw on virtio-scsi (on a 4 GiB boot disk: the
    state partition must grow) beside NVMe local SSDs, GCE's DMI product name, the metadata server at
    169.254.169.254 (a loopback one behind a guestfwd) serving the region's bundle. The VM grows its state
    partition, reads the bundle and its minion joins: pending, attested against the registered manifest
    (the same UKI as the USB drive's). Powered off, its UKI modified on the boot disk and powered on again,
    the same minion is refused at join."""
    from tests.fixtures.gce_metadata import Instance, metadata_server
    from tests.image_builder import gce_disk

    doc = json.loads((image / "manifest.json").read_text())
    gce = doc["targets"]["gce"]
    raw = gce_disk.unpack(image / gce["file"], tmp_path / "gce")
    with raw.open("r+b") as fh:
        fh.truncate(4 * GiB)  # the VM's disk_size_gb is larger than the image
    bundle = tmp_path / "bundle.json"
    url = f"https://{vm.GCE_CONTROL_PLANE}:8470"
    _run(cp, "region", "bundle", "vm", "-o", str(bundle), "--control-plane-url", url)
    tpm = provision_swtpm(tmp_path / "tpm", vendor)
    minion_id = vm.minion_id_from_ek_cert(tpm.ek_certificate.read_bytes())
    metadata = Instance({"rigbase-bundle": bundle.read_text()})

    def pending() -> dict[str, Any] | None:
        rows = [p for p in _get(cp, "/v1/pending-minions")["items"] if p["minion_id"] == minion_id]
        return rows[0] if rows and rows[0]["attested"] else None

    def refused() -> list[dict[str, Any]]:
        return list(_get(cp, "/v1/join-refusals", minion_id=minion_id)["items"])

    with metadata_server(metadata) as host:
        machine = vm.Machine(
            tmp_path / "vm",
            None,
            _disks(tmp_path / "disks")["nvme"],  # local SSDs are NVMe on Compute Engine too
            tpm.state_dir,
            control_plane_port=int(cp.url.rsplit(":", 1)[1].rstrip("/")),
            gce_disk=raw,
            metadata_port=int(host.rsplit(":", 1)[1]),
        )
        with machine as m:
            joined = _until("the GCE VM's minion pending and attested", 900, pending, m)
            console = m.text()
            assert not refused(), refused()
            # power off, change the UKI on the boot disk (as an attacker with the disk would), power on
            m.close()
            second = len(m.output)
            subprocess.run(
                [
                    "mcopy",
                    "-o",
                    "-i",
                    f"{raw}@@{gce['partitions']['rigbase-esp']['offset']}",
                    str(_modified_uki(image, tmp_path / "rigbase.efi")),
                    "::/EFI/Linux/rigbase.efi",
                ],
                check=True,
                env={**os.environ, "MTOOLS_SKIP_CHECK": "1"},
            )
            m.start()
            rows = _until("a refusal of the modified image", 900, refused, m)
    assert joined["requirements"] == "pass" and joined["identity"] == "tpm" and not joined["refusal"], joined
    assert "/computeMetadata/v1/instance/attributes/rigbase-bundle" in metadata.requests
    assert "RIGBASE-BOOT-SOURCE=nvme" in console  # the installed layout: no installer on a GCE disk
    # rigbase-grow-state took the state partition and its filesystem to the end of the 4 GiB disk at first
    # boot; after the hard power-off it left them alone and the journalled filesystem mounted (the minion
    # ran from it and was refused)
    assert re.search(r"rigbase-grow-state: growing rigbase-state from 256 MiB to \d+ MiB", console)
    assert "rigbase-grow-state: " not in m.text(second), m.text(second)[-3000:]
    last = gce_disk.partitions(raw)[-1]
    assert last["name"] == "rigbase-state" and (last["start"] + last["size"]) * 512 > 4 * GiB - 2 * 2**20
    reasons = " ".join(r.get("reason") or "" for r in rows)
    # the boot-path check (PCR 4: the modified UKI's Authenticode digest is no registered image's) runs
    # before the manifest's PCR 11 comparison; either refusal names what the operator must do
    assert "attestation_unknown_boot_application" in reasons or (
        "manifest" in reasons and "PCR 11" in reasons
    ), reasons
