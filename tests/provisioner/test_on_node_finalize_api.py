"""On-node finalize, the control plane's side, over HTTP (docs/join-protocol.md, "Finalize"): a real
`provision serve`, real swtpm joins with the minion's own message builders, then the finalize work in the
heartbeat answer, the playbook bundle download, and FinalizeReports as a minion posts them. The playbooks
themselves run on the minion side (tests/minion/)."""

from __future__ import annotations

import gzip
import hashlib
import io
import itertools
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from contracts.finalize import BUNDLE_MEDIA_TYPE, BUNDLE_ROUTE, REPORT_ROUTE, FinalizeWork
from provisioner.lab.swtpm import Swtpm, VendorCA
from tests.fixtures.control_plane import ControlPlane, start_control_plane
from tests.fixtures.finalize import current_work, finish_finalize
from tests.fixtures.swtpm import _started_copy
from tests.provisioner.test_join_http import Minion

VARIABLES = {
    "rigbase_node_name",
    "rigbase_hostname",
    "rigbase_service",
    "rigbase_region",
    "rigbase_control_plane_url",
    "rigbase_storage_mode",
    "rigbase_nvme_drives",
    "rigbase_sata_drives",
    "rigbase_nfs_clients",
    "rigbase_nfs_server",
}
_EK_SERIAL = itertools.count(300)  # one control plane for the module: every minion needs its own EK


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory, tpm_vendor_ca: VendorCA) -> Iterator[ControlPlane]:
    """Regions `loc` (local storage) and `hub` (central storage)."""
    with start_control_plane(tmp_path_factory.mktemp("finalize-cp") / "home") as server:
        ca_file = tmp_path_factory.mktemp("ca") / "vendor.pem"
        ca_file.write_bytes(b"".join(tpm_vendor_ca.certificate_pems()))
        out = server.provision("provider", "enable", "physical")
        assert out.returncode == 0, out.stderr
        for name, mode in (("loc", "local"), ("hub", "central")):
            api(server, "POST", "/v1/regions", {"name": name, "provider": "physical", "storage_mode": mode})
        out = server.provision("tpm-ca", "add", str(ca_file))
        assert out.returncode == 0, out.stderr
        yield server


@pytest.fixture
def minion(
    cp: ControlPlane, tmp_path: Path, tpm_vendor_ca: VendorCA, _golden_swtpm: Callable[[VendorCA, int], Swtpm]
) -> Iterator[Callable[[], Minion]]:
    made: list[Minion] = []

    def make() -> Minion:
        tpm = _started_copy(_golden_swtpm(tpm_vendor_ca, next(_EK_SERIAL)), tmp_path / f"swtpm-{len(made)}")
        m = Minion(tpm, cp.url)
        made.append(m)
        return m

    yield make
    for m in made:
        m.close()
        m.tpm.remove()


def api(cp: ControlPlane, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    with cp.client() as client:
        response = client.request(method, path, json=body)
    assert response.is_success, response.text
    return response.json()


def joined(cp: ControlPlane, m: Minion, name: str, region: str, service: str = "compute") -> dict[str, Any]:
    """Add the minion as node `name` and join it: the proof's answer (credential, node id)."""
    api(
        cp,
        "POST",
        "/v1/nodes",
        {"name": name, "region": region, "minion_id": m.minion_id, "service": service},
    )
    jt = api(cp, "POST", f"/v1/regions/{region}/join-tokens", {"ttl": "1h"})["token"]
    answer = m.join(jt)
    assert answer.status_code == 200 and answer.json()["state"] == "provisioning", answer.text
    return dict(answer.json())


def report(
    m: Minion, node: dict[str, Any], body: dict[str, Any], credential: str | None = None
) -> httpx.Response:
    return m.http.post(
        REPORT_ROUTE.format(node_id=node["node_id"]),
        json=body,
        headers={"Authorization": f"Bearer {credential or node['node_credential']}"},
    )


def history(cp: ControlPlane, name: str) -> list[dict[str, Any]]:
    return list(api(cp, "GET", f"/v1/nodes/{name}/history")["items"])


def show(cp: ControlPlane, name: str) -> dict[str, Any]:
    return dict(api(cp, "GET", f"/v1/nodes/{name}"))


def test_storage_node_gets_work_downloads_the_bundle_and_goes_active(
    cp: ControlPlane, minion: Callable[[], Minion]
) -> None:
    m = minion()
    node = joined(cp, m, "store-1", "hub", "storage")
    work = FinalizeWork.model_validate(current_work(m.http, node["node_id"], node["node_credential"]))
    assert work.playbook == "finalize-storage.yml" and set(work.variables) == VARIABLES
    assert (
        work.variables["rigbase_storage_mode"] == "central" and work.variables["rigbase_nfs_server"] is None
    )
    assert work.variables["rigbase_nfs_clients"] == ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"]
    assert work.variables["rigbase_service"] == "storage" and work.variables["rigbase_hostname"] == "store-1"
    # The bundle: the node credential opens it, its bytes have the digest the work names.
    auth = {"Authorization": f"Bearer {node['node_credential']}"}
    got = m.http.get(work.bundle_path, headers=auth)
    assert got.status_code == 200 and got.headers["content-type"] == BUNDLE_MEDIA_TYPE
    assert hashlib.sha256(got.content).hexdigest() == work.bundle_digest
    assert m.http.get(work.bundle_path, headers=auth).content == got.content  # the same bytes again
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(got.content))) as tar:
        members = tar.getmembers()
    names = [t.name for t in members]
    assert {"finalize-compute.yml", "finalize-storage.yml"} <= set(names) and names == sorted(names)
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert {(t.mtime, t.uid, t.gid) for t in members} == {(0, 0, 0)}
    assert m.http.get(work.bundle_path).status_code == 401
    missing = m.http.get(BUNDLE_ROUTE.format(digest="0" * 64), headers=auth)
    assert missing.status_code == 404 and missing.json()["code"] == "bundle_not_found", missing.text
    # A run's events go into the history as they come; the ok outcome makes the storage node active.
    events = [
        {"task": "Check the hostname", "status": "started"},
        {"task": "Check the hostname", "status": "ok"},
        {"task": "Export the cache", "status": "changed"},
    ]
    assert report(m, node, {"generation": work.generation, "events": events}).status_code == 200
    assert show(cp, "store-1")["state"] == "provisioning"
    done = {"generation": work.generation, "outcome": {"ok": True, "changed": 1, "seconds": 12.5}}
    answer = report(m, node, done)
    assert answer.status_code == 200 and answer.json()["state"] == "active", answer.text
    shown = show(cp, "store-1")
    assert shown["state"] == "active" and shown["finalize_applied"] == work.generation
    reasons = [e["reason"] for e in history(cp, "store-1")]
    assert "task 'Check the hostname': ok" in reasons and "task 'Export the cache': changed" in reasons
    assert not [r for r in reasons if r and r.endswith(": started")]
    assert any(r and r.startswith("finalized in 12.5 s (1 task(s) changed)") for r in reasons)
    out = cp.provision("node", "show", "store-1")
    assert out.returncode == 0 and "finalize_applied" in out.stdout and work.generation[:12] in out.stdout
    # What the minion reports of its finalize in the next heartbeat is what `node show` shows.
    actual = {"generation": work.generation, "state": "applied", "facts": {"scratch": {"mounted": True}}}
    beat = m.http.post(
        f"/v1/nodes/{node['node_id']}/heartbeat",
        json={"version": 1, "actual": {"finalize": actual}},
        headers=auth,
    )
    assert beat.status_code == 200, beat.text
    assert show(cp, "store-1")["finalize_actual"] == actual


def test_compute_node_in_a_central_region_needs_an_active_storage_node_and_mounts_it(
    cp: ControlPlane, minion: Callable[[], Minion]
) -> None:
    storage, compute = minion(), minion()
    api(cp, "POST", "/v1/regions", {"name": "hub2", "provider": "physical", "storage_mode": "central"})
    with cp.client() as client:
        early = client.post(
            "/v1/nodes", json={"name": "gpu-x", "region": "hub2", "minion_id": compute.minion_id}
        )
    assert early.status_code == 409 and "no storage node yet" in early.json()["message"], early.text
    snode = joined(cp, storage, "store-2", "hub2", "storage")
    with cp.client() as client:
        waiting = client.post(
            "/v1/nodes", json={"name": "gpu-x", "region": "hub2", "minion_id": compute.minion_id}
        )
    assert waiting.status_code == 409, waiting.text
    assert "storage node 'store-2' is provisioning, not active" in waiting.json()["message"]
    finish_finalize(cp.url, snode["node_id"], snode["node_credential"])
    assert show(cp, "store-2")["state"] == "active"
    cnode = joined(cp, compute, "gpu-x", "hub2")
    work = current_work(cp.url, cnode["node_id"], cnode["node_credential"])
    assert work["playbook"] == "finalize-compute.yml"
    # the storage node's address as its minion connects from (no operator hostname was given)
    assert work["variables"]["rigbase_nfs_server"] == "127.0.0.1"
    assert work["variables"]["rigbase_sata_drives"] == []
    finish_finalize(cp.url, cnode["node_id"], cnode["node_credential"], work["generation"])
    assert show(cp, "gpu-x")["state"] == "maintenance"


def test_a_storage_node_is_refused_in_a_local_region(cp: ControlPlane) -> None:
    with cp.client() as client:
        refused = client.post(
            "/v1/nodes", json={"name": "nas-l", "region": "loc", "minion_id": "e" * 32, "service": "storage"}
        )
    assert refused.status_code == 409, refused.text
    message = refused.json()["message"]
    assert "\n" not in message and "only regions in central storage mode" in message


def test_local_compute_work_carries_its_drives_and_a_failed_task_errors_it(
    cp: ControlPlane, minion: Callable[[], Minion]
) -> None:
    m = minion()
    node = joined(cp, m, "gpu-l", "loc")
    inventory = {
        "gpus": [],
        "drives": [
            {"name": "sdb", "kind": "sata", "size_bytes": 4_000_000_000_000, "rotational": False},
            {"name": "nvme0n1", "kind": "nvme", "size_bytes": 2_000_000_000_000},
            {"name": "sda", "kind": "sas", "size_bytes": 3_000_000_000_000, "rotational": True},
        ],
    }
    beat = m.http.post(
        f"/v1/nodes/{node['node_id']}/heartbeat",
        json={"version": 1, "actual": {}, "inventory": inventory},
        headers={"Authorization": f"Bearer {node['node_credential']}"},
    )
    assert beat.status_code == 200, beat.text
    work = beat.json()["desired"]["finalize"]
    assert work["variables"]["rigbase_storage_mode"] == "local"
    assert work["variables"]["rigbase_nfs_server"] is None
    assert work["variables"]["rigbase_sata_drives"] == [
        {"path": "/dev/sda", "size_bytes": 3_000_000_000_000, "rotational": True},
        {"path": "/dev/sdb", "size_bytes": 4_000_000_000_000, "rotational": False},
    ]
    assert work["variables"]["rigbase_nvme_drives"] == [
        {"path": "/dev/nvme0n1", "size_bytes": 2_000_000_000_000}
    ]
    # A stale generation changes nothing: 409, no history line, same state.
    before = history(cp, "gpu-l")
    stale = report(m, node, {"generation": "f" * 64, "events": [{"task": "x", "status": "ok"}]})
    assert stale.status_code == 409 and stale.json()["code"] == "finalize_generation_stale", stale.text
    assert history(cp, "gpu-l") == before and show(cp, "gpu-l")["state"] == "provisioning"
    # Another node's credential is refused.
    other = minion()
    onode = joined(cp, other, "gpu-o", "loc")
    wrong = report(m, node, {"generation": work["generation"]}, credential=onode["node_credential"])
    assert wrong.status_code in (401, 403), wrong.text
    assert history(cp, "gpu-l") == before
    # A failed task: errored, the reason names it; the minion's text is escaped to one line.
    failed = {
        "generation": work["generation"],
        "events": [{"task": "Build the scratch array", "status": "failed", "message": "mdadm: no\ndevices"}],
        "outcome": {"ok": False, "failed_task": "Build the scratch array", "message": "mdadm: no\ndevices"},
    }
    answer = report(m, node, failed)
    assert answer.status_code == 200 and answer.json()["state"] == "errored", answer.text
    shown = show(cp, "gpu-l")
    assert shown["reason"] == "finalize failed at task 'Build the scratch array': mdadm: no\\ndevices"
    assert shown["finalize_applied"] is None
    assert "task 'Build the scratch array': failed: mdadm: no\\ndevices" in [
        e["reason"] for e in history(cp, "gpu-l")
    ]
    # An errored node has no current work: a late report is stale.
    assert report(m, node, failed).status_code == 409


def test_a_failed_reapply_errors_a_node_in_service(cp: ControlPlane, minion: Callable[[], Minion]) -> None:
    m = minion()
    node = joined(cp, m, "gpu-r", "loc")
    work = current_work(m.http, node["node_id"], node["node_credential"])
    finish_finalize(m.http, node["node_id"], node["node_credential"], work["generation"])
    assert show(cp, "gpu-r")["state"] == "maintenance"
    answer = report(
        m, node, {"generation": work["generation"], "outcome": {"ok": False, "message": "no python3"}}
    )
    assert answer.status_code == 200, answer.text
    shown = show(cp, "gpu-r")
    assert shown["state"] == "errored" and shown["reason"] == "finalize failed: no python3"
    assert shown["finalize_applied"] == work["generation"]  # the last one that did apply
