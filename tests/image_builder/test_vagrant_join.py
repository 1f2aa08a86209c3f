"""The Vagrant lab's node joins: `vagrant up` of the top-level Vagrantfile (libvirt provider, TCG) boots the
USB image built from a region's bundle, the test answers the installer on the serial console as an
operator does (`virsh console`), the installed OS boots, its minion joins the control plane on the host
with TPM attestation (libvirt's own swtpm, its EK certificate from swtpm-localca), and the node is adopted
as the region's storage node: finalize inside the VM, active, then into maintenance (docs/vagrant.md).

The VM's network is QEMU's user network (`RIGBASE_NETWORK_MODE=user`), and libvirtd runs in a network
namespace of the test (tests/image_builder/libvirt_host.py): the guest's 10.0.2.2:8470 is that
namespace's loopback, bridged to the control plane on the host's loopback. No bridge, no DHCP server and
no guest traffic on the host's interfaces.

It runs as `make test-vagrant` (minutes under TCG, more than the suite's budget holds: docs/testing.md)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from image_builder import build, manifest
from image_builder.plan import BuildConfig
from tests.fixtures.control_plane import PROVISION, ControlPlane, start_control_plane
from tests.image_builder.conftest import _cache_dir
from tests.image_builder.libvirt_host import (
    Console,
    Libvirtd,
    forward_into,
    libvirt_dir,
    libvirtd,
    vagrant_env,
    virsh,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

REPO = Path(__file__).resolve().parents[2]
GUEST_HOST = "10.0.2.2"  # QEMU user networking's gateway: the loopback of libvirtd's namespace
CP_PORT = 8470
EPOCH = 1700000000
# what libvirt's swtpm_setup signs each VM's EK certificate with (swtpm-localca's defaults)
LOCALCA = Path("/var/lib/swtpm-localca")


def _run(cp: ControlPlane, *args: str) -> str:
    out = cp.provision(*args)
    assert out.returncode == 0, f"provision {' '.join(args)}: rc {out.returncode}\n{out.stdout}{out.stderr}"
    return out.stdout


def _get(cp: ControlPlane, path: str, **params: str) -> Any:
    with cp.client() as client:
        answer = client.get(path, params=params)
        answer.raise_for_status()
        return answer.json()


@pytest.fixture(scope="module")
def daemon() -> Iterator[Libvirtd]:
    with libvirtd() as d:
        if d.pid is None:
            pytest.skip(
                "a libvirtd already runs on this host: a VM on its QEMU user network would reach the host's "
                "network; stop it (systemctl stop libvirtd) so that the test starts one in a namespace"
            )
        yield d


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    home = tmp_path_factory.mktemp("vagrant-cp") / "home"
    started = start_control_plane(home, advertise=("127.0.0.1", GUEST_HOST))
    server = started.__enter__()
    try:
        _run(server, "provider", "enable", "physical")
        _run(server, "region", "create", "vag", "--provider", "physical", "--storage-mode", "central")
        yield server
    finally:
        started.__exit__(None, None, None)


@pytest.fixture(scope="module")
def image(cp: ControlPlane, tmp_path_factory: pytest.TempPathFactory, source_snapshot: Path) -> Path:
    """The region's USB image for https://10.0.2.2:8470, its builder key trusted, its manifest registered."""
    d = tmp_path_factory.mktemp("vagrant-image")
    bundle = d / "bundle.json"
    _run(
        cp,
        "region",
        "bundle",
        "vag",
        "-o",
        str(bundle),
        "--control-plane-url",
        f"https://{GUEST_HOST}:{CP_PORT}",
    )
    priv, pub = manifest.keygen(d / "builder.pem")
    config = BuildConfig(
        bundle=bundle, output=d / "out", cache=_cache_dir(), key=priv, source_date_epoch=EPOCH,
        repo=source_snapshot, targets=("usb",),
    )  # fmt: skip
    build.build(config, log=lambda _m: None)
    _run(cp, "image", "trust-key", str(pub), "--name", "vagrant-test")
    _run(cp, "image", "register", str(d / "out" / "manifest.json"))
    return d / "out" / "rigbase-usb.img"


@pytest.fixture
def workdir() -> Iterator[Path]:
    with libvirt_dir("rigbase-join") as d:
        yield d


def _until(what: str, timeout: float, probe: Any, console: Console) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := probe():
            return value
        time.sleep(3)
    tail = "\n".join(line[:200] for line in console.text().splitlines()[-60:])
    raise AssertionError(f"{what} did not happen within {timeout:.0f} s; console tail:\n{tail}")


def test_a_vagrant_vm_installs_joins_finalizes_and_reaches_maintenance(
    daemon: Libvirtd, cp: ControlPlane, image: Path, workdir: Path
) -> None:
    usb = workdir / "rigbase-usb.img"
    subprocess.run(["cp", "--sparse=always", str(image), str(usb)], check=True)
    os.chmod(usb, 0o644)
    pool = f"rigbase-join-{workdir.name[-8:]}"
    prefix = f"{pool}_"
    domain = f"{prefix}node1"
    env = vagrant_env(usb, workdir, pool, "user")
    virsh("pool-create-as", pool, "dir", "--target", str(workdir))

    def vagrant(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["vagrant", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
        )

    stages: dict[str, float] = {}
    began = time.monotonic()

    def stage(name: str) -> None:
        stages[name] = round(time.monotonic() - began)

    cp_port = int(cp.url.rsplit(":", 1)[1])
    console: Console | None = None
    try:
        with forward_into(daemon, CP_PORT, cp_port, workdir):
            up = vagrant("up", "--provider=libvirt")
            assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
            console = Console(domain)
            stage("vagrant up")
            xml = virsh("dumpxml", domain).stdout
            assert "rigbase-net" in xml and "<interface" not in xml, xml  # QEMU's user net, no libvirt one
            shown = _install(cp, console, stage)
            _adopt_and_maintain(cp, console, shown, stage)
    finally:
        if console is not None:
            console.close()
        down = vagrant("destroy", "-f")
        virsh("pool-destroy", pool, check=False)
        print("stages (s since vagrant up began):", json.dumps(stages))
    assert down.returncode == 0, down.stdout + down.stderr
    assert prefix not in virsh("list", "--all", "--name").stdout


def _install(cp: ControlPlane, console: Console, stage: Callable[[str], None]) -> str:
    """Answer the installer, trust libvirt's TPM CA, wait for the installed OS's banner: its minion_id."""
    console.wait_for(r"Type 'yes' to ERASE", 900)
    stage("installer's question")
    # libvirt made the VM's TPM, its EK certificate signed by swtpm-localca: trust that chain
    for pem in ("issuercert.pem", "swtpm-localca-rootca-cert.pem"):
        assert (LOCALCA / pem).is_file(), f"libvirt's swtpm_setup wrote no {LOCALCA / pem}"
        _run(cp, "tpm-ca", "add", str(LOCALCA / pem))
    mark = len(console.output)
    console.send("yes\n")
    console.wait_for(r"installed; rebooting", 1200, mark)
    stage("installed")
    shown = console.wait_for(r"(?:MINION_ID=|minion_id +)([0-9a-f]{32})", 900, mark).group(1)
    stage("banner")
    return shown


def _adopt_and_maintain(cp: ControlPlane, console: Console, shown: str, stage: Callable[[str], None]) -> None:
    """Pending and attested, adopted as the storage node, finalized to active, then into maintenance."""

    def pending() -> bool:
        rows = [p for p in _get(cp, "/v1/pending-minions")["items"] if p["minion_id"] == shown]
        assert not rows or rows[0]["requirements"] == "pass", rows  # a refusal: stop at once
        return bool(rows)

    _until("the minion showing up in `provision node pending`", 600, pending, console)
    stage("pending")
    added = subprocess.run(
        [str(PROVISION), "node", "add", "store-1", "--region", "vag", "--minion-id", shown,
         "--service", "storage", "--wait", "--timeout", "1800", "--json"],
        env=cp.env, capture_output=True, text=True, timeout=1900,
    )  # fmt: skip
    node = _get(cp, "/v1/nodes/store-1", region="vag")
    assert added.returncode == 0 and node["state"] == "active", (added.stderr, node, console.text()[-3000:])
    stage("active")
    _run(cp, "node", "maintenance", "store-1", "on", "--reason", "vagrant test")
    node = _get(cp, "/v1/nodes/store-1", region="vag")
    assert node["state"] == "maintenance", node
    # the node beats on in maintenance, over the same forward
    beat = node["last_heartbeat_at"]
    _until(
        "a heartbeat in maintenance", 180,
        lambda: _get(cp, "/v1/nodes/store-1", region="vag")["last_heartbeat_at"] != beat, console,
    )  # fmt: skip
    stage("maintenance")
