"""Datastores against real servers, mounted by a guest booted from the image.

This host's kernel has neither the nfs nor the cifs filesystem; the image's kernel has both. So:
- nfs-ganesha (userspace NFSv4) and smbd serve the datastores from a network namespace of the test;
- QEMU (TCG) boots the image's own kernel, initramfs and verity root from the built USB image, in a second
  namespace, with a user network whose only ways out are two forwards to the servers (2049 and 445);
- the datastores are added to a region with the control plane's own services (the SMB password sealed in
  its store) and sent as the control plane sends them to a node (`datastore_access`, unsealed);
- the image's systemd runs datastore_probe.py from a data disk (`systemd.run=`, then it powers off): the
  minion's own bind_all, RunPlan and podman, with a customer's user namespace, against the real mounts;
- the test then reads, on the servers' side, who owns what the job wrote.

What it shows (docs/datastores.md, "Tested against real servers"):
- a job's output on an all_squash NFS export belongs, on the server, to the export's anonymous user;
- an SMB share's files belong to the datastore's Samba user, and the job can write there;
- symlinks on the server that point outside the root (absolute, or `..` above it) resolve inside it;
- an export that squashes root only is refused at the mount, in one line naming all_squash;
- podman's hard disk quota (`RIGBASE_JOBS_DISK_QUOTA=storage-opt`) stops a worker's writes on a real XFS
  volume mounted with project quotas."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from image_builder import pe
from provisioner.lab.netns import Lab, Netns
from tests.fixtures.file_servers import NfsExport, SambaUser, Server, start_ganesha, start_samba

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

HERE = Path(__file__).resolve().parent
GUEST_ADDRESS, GATEWAY, FORWARD = "10.0.2.15/24", "10.0.2.2", "10.0.2.100"
ANON_UID = ANON_GID = 1500  # the all_squash export's anonymous user
ALICE = SambaUser("alice", 1600, "sealed-in-the-store")
MARKER = "inside the datastore root"


@dataclass(frozen=True)
class Servers:
    ns: Netns
    address: str
    client_ns: Netns
    client_address: str
    nfs_out: Path
    nfs_squashed: Path
    smb_share: Path


def _tree(base: Path) -> tuple[Path, Path, Path]:
    """What the servers hold before the job: directories owned as an operator would set them up, a marker
    where the root's own `etc` is, and links that point out of the root."""
    out, squashed, share = base / "nfs-out", base / "nfs-squashed", base / "smb-office"
    for d in (out / "jobs/j1", out / "etc", squashed / "jobs", share / "ml/data"):
        d.mkdir(parents=True)
    (out / "etc/marker.txt").write_text(MARKER + "\n")
    (out / "escape").symlink_to("/etc")  # absolute: the server's and the node's /etc are both outside
    (out / "up").symlink_to("../../..")  # relative, above the root
    for path in (out, out / "jobs", out / "jobs/j1"):
        os.chown(path, ANON_UID, ANON_GID)
    (share / "ml/data/input.txt").write_text("input-over-smb\n")
    for path in (share, share / "ml", share / "ml/data", share / "ml/data/input.txt"):
        os.chown(path, ALICE.uid, ALICE.uid)
    return out, squashed, share


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    # pytest's directories are 0700: the servers act as their squashed and Samba users, who must get in
    base = Path(tempfile.mkdtemp(prefix="rigbase-datastores-"))
    base.chmod(0o755)
    started: list[Server] = []
    try:
        out, squashed, share = _tree(base / "data")
        with Lab("ds") as lab:
            srv, cli = lab.netns("srv"), lab.netns("cli")
            lan = lab.lan("10.78.0.0/24")
            address = lan.attach(srv, 1, multicast_route=False)
            client = lan.attach(cli, 2, multicast_route=False)
            exports = [
                NfsExport(1, out, "/out", "All_Squash", ANON_UID, ANON_GID),
                NfsExport(2, squashed, "/squashed", "Root_Squash", ANON_UID, ANON_GID),
            ]
            started.append(start_ganesha(srv, base / "ganesha", address, client, exports))
            started.append(start_samba(srv, base / "samba", address, {"office": share}, ALICE))
            yield Servers(srv, address, cli, client, out, squashed, share)
            for server in started:
                server.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _sparse(path: Path, size: int) -> Path:
    with path.open("wb") as f:
        f.truncate(size)
    return path


def _regional_datastores(d: Path) -> list[dict]:
    """The three datastores as an operator adds them to a region (`provision datastore add`: the SMB
    password sealed in the store), and as the control plane sends them to a node for its workers."""
    from provisioner.services.data import datastores
    from provisioner.services.jobs.job_assignments import datastore_access
    from provisioner.services.regions import providers, regions
    from provisioner.store.engine import make_engine, make_sessionmaker
    from provisioner.store.migrate import upgrade

    url = f"sqlite:///{d / 'rigbase.db'}"
    d.mkdir()
    engine = make_engine(url)
    upgrade(url, engine)
    actor = "operator:test"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RIGBASE_HOME", str(d / "home"))  # the sealing key
        with make_sessionmaker(engine).begin() as s:
            providers.enable(s, "physical", {}, actor=actor)
            region = regions.create(s, "vm", provider="physical", actor=actor)
            add = {"region": "vm", "address": FORWARD, "actor": actor}
            datastores.add(s, "out", type="nfs", root="/out", **add)
            datastores.add(s, "squashed", type="nfs", root="/squashed", **add)
            office = datastores.add(
                s,
                "office",
                type="smb",
                root="/office/ml",
                username=ALICE.name,
                password=ALICE.password,
                **add,
            )
            assert office.sealed_password and ALICE.password not in str(office.sealed_password)
            sent = datastore_access(s, region.id, {"out", "squashed", "office"})
    engine.dispose()
    return [a.model_dump(mode="json") for a in sent]


@pytest.fixture(scope="module")
def probe(built_image, servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Boot the image's UKI parts directly (the same kernel, initramfs and verity root hash as its boot
    path) with the probe as the one unit systemd runs; return what the probe wrote."""
    d = tmp_path_factory.mktemp("datastores-vm")
    uki = (built_image.out / "rigbase.efi").read_bytes()
    (d / "vmlinuz").write_bytes(pe.section(uki, ".linux"))
    (d / "initrd").write_bytes(pe.section(uki, ".initrd"))
    cmdline = pe.section(uki, ".cmdline").rstrip(b"\0").decode().replace("console=tty0 ", "")
    data = d / "data"
    data.mkdir()
    shutil.copy(HERE / "datastore_probe.py", data / "datastore_probe.py")
    datastores = _regional_datastores(d / "store")
    config = {"guest_address": GUEST_ADDRESS, "gateway": GATEWAY, "xfs_device": "/dev/vdc"}
    (data / "config.json").write_text(json.dumps({**config, "datastores": datastores}))
    subprocess.run(["mkfs.ext4", "-q", "-d", str(data), str(d / "data.img"), "16M"], check=True)
    xfs = _sparse(d / "xfs.img", 3 * 2**30)
    subprocess.run(["mkfs.xfs", "-q", str(xfs)], check=True)
    result = _sparse(d / "result.img", 2**20)
    run = "mount -o ro /dev/vdb /mnt && exec python3 /mnt/datastore_probe.py /mnt/config.json /dev/vdd"
    forwards = ",".join(
        f"guestfwd=tcp:{FORWARD}:{port}-cmd:socat - TCP:{servers.address}:{port}" for port in (2049, 445)
    )
    argv = [
        "qemu-system-x86_64", "-machine", "q35,accel=tcg", "-cpu", "max", "-smp", "1", "-m", "1536",
        "-nographic", "-no-reboot", "-no-user-config",
        "-kernel", str(d / "vmlinuz"), "-initrd", str(d / "initrd"),
        "-append", f"{cmdline} systemd.show_status=0 systemd.run=\"/bin/sh -c '{run}'\"",
        "-drive", f"if=virtio,format=raw,snapshot=on,file={built_image.out / 'rigbase-usb.img'}",
        "-drive", f"if=virtio,format=raw,file={d / 'data.img'}",
        "-drive", f"if=virtio,format=raw,file={xfs}",
        "-drive", f"if=virtio,format=raw,file={result}",
        "-netdev", f"user,id=n0,restrict=on,{forwards}", "-device", "virtio-net-pci,netdev=n0",
    ]  # fmt: skip
    console = d / "console.log"
    started = time.monotonic()
    with console.open("wb") as out:
        qemu = servers.client_ns.popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        try:
            qemu.wait(timeout=1200)
        except subprocess.TimeoutExpired:
            qemu.kill()
            qemu.wait()
    text = console.read_text(errors="replace")
    assert "RIGBASE-PROBE done" in text, f"the probe did not finish; console tail:\n{text[-4000:]}"
    found = json.loads(result.read_bytes().rstrip(b"\0"))
    found["boot_and_probe_s"] = time.monotonic() - started
    assert "crashed" not in found, found.get("crashed")
    return found


def test_a_jobs_output_on_an_all_squash_export_belongs_to_the_anonymous_user(
    probe: dict, servers: Servers
) -> None:
    job = probe["job"]
    assert job["started"], job
    written = servers.nfs_out / "jobs/j1/result.txt"
    assert written.read_text() == "from-the-job\n"
    st = written.stat()
    assert (st.st_uid, st.st_gid) == (ANON_UID, ANON_GID)
    # the container's uids were its account's host range, never the node's: its root was uid 2³⁰ or more
    first, size = probe["userns"]
    assert (servers.nfs_out / "jobs/j1/uid_map.txt").read_text().split() == ["0", str(first), str(size)]
    assert first >= 2**30


def test_a_job_reads_and_writes_an_smb_share_as_the_datastores_user(probe: dict, servers: Servers) -> None:
    assert "input-over-smb" in probe["job"]["log"]
    written = servers.smb_share / "ml/data/from-job.txt"
    assert written.read_text() == "written-over-smb\n"
    assert written.stat().st_uid == ALICE.uid


def test_server_side_links_out_of_the_root_resolve_inside_it(probe: dict) -> None:
    """`/escape` → /etc and `/up` → ../../.. are the server's links; the job gets the root's own etc."""
    log = probe["job"]["log"]
    assert f"marker: {MARKER}" in log
    assert "passwd" not in log and "shadow" not in log  # neither the node's nor the server's /etc
    climb = probe["climb"]
    assert climb["exit_code"] == 0 and MARKER in climb["log"], climb


def test_an_export_that_squashes_root_only_is_refused_in_one_line(probe: dict) -> None:
    refused = probe["root_squash"].get("refused", "")
    assert "all_squash" in refused and "\n" not in refused, probe["root_squash"]


def test_podmans_hard_quota_stops_a_worker_on_a_real_xfs_volume(probe: dict) -> None:
    quota = probe["quota"]
    assert quota["started"], quota
    log = quota["log"]
    assert "No space left on device" in log or "Disk quota exceeded" in log, log
    assert "dd-exit 0" not in log


def test_the_job_binds_are_undone_and_only_the_roots_stay_mounted(probe: dict) -> None:
    assert probe["left_binds"] == []
    assert [Path(p).name for p in probe["staged"]] == ["office", "out", "squashed"]
