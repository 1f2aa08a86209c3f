"""Devices in the control plane: a device is a node whose service is `device`.

Over HTTP with a real `provision serve`, real swtpm minions (the attested join of tests/provisioner/
test_join_http.py) and the real `provision device` CLI: refused in a local-storage region with
the product rules' reason and nothing stored; added in a central region, it joins, gets the device
playbook, and enters active as soon as its finalize completes (no maintenance step); show, list, remove,
history. On each store (SQLite, PostgreSQL), through the services: the refusals leave no row, and
device-days count every device that existed on a day, added and removed ones included."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from contracts.device import DeviceReport
from contracts.errors import RuleViolation
from contracts.finalize import FinalizeEvent, TaskStatus
from minion.finalize.apply import apply_work
from minion.finalize.paths import FinalizePaths
from provisioner.domain.states import NodeState, Service
from provisioner.lab.swtpm import VendorCA
from provisioner.services.common.account_lookup import root_account
from provisioner.services.devices import device_days
from provisioner.services.fleet import nodes
from provisioner.services.regions import providers
from provisioner.services.regions import regions as region_service
from provisioner.store.models import AuditEvent, Node
from tests.fixtures.control_plane import PROVISION, ControlPlane
from tests.fixtures.finalize import current_work, finish_finalize
from tests.fixtures.joins import joinable_control_plane
from tests.fixtures.postgres import Store
from tests.minion.finalize_helpers import BUNDLE, base_root, root, work
from tests.provisioner.test_join_http import PASSING, Minion, api, cli, minion

# fixtures: the lab root the device playbook runs in; test_join_http's swtpm minion, made against this `cp`
__all__ = ["base_root", "minion", "root"]

LOCAL_REFUSAL = (
    "region loc uses local storage: devices need a central-storage region; create a new region to add devices"
)
# What an Orin NX minion reports (contracts/device.py; the values of regions/jetson.yaml's p3767-0000)
ORIN_NX = DeviceReport(
    model="orin-nx",
    model_name="NVIDIA Jetson Orin NX",
    device_tree_model="NVIDIA Jetson Orin NX Engineering Reference Developer Kit",
    module="p3767-0000",
    compatible=["nvidia,p3768-0000+p3767-0000", "nvidia,p3767-0000", "nvidia,tegra234"],
    chip_id=0x23,
    memory_gib=16,
    l4t_release="R35.4.1",
    jetpack="5.1.2",
    gpu_cores=1024,
    dla_count=2,
    tpm="firmware",
    video_devices=["/dev/video0", "/dev/video1"],
    media_devices=["/dev/media0"],
).model_dump(mode="json")


# ---------------------------------------------------------------- over HTTP, with the CLI


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory, tpm_vendor_ca: VendorCA) -> Iterator[ControlPlane]:
    """Regions `loc` (local storage) and `edge` (central storage, its storage node not added yet)."""
    with joinable_control_plane(
        tmp_path_factory,
        tpm_vendor_ca,
        "devices",
        [
            ["region", "create", "loc", "--provider", "physical"],
            ["region", "create", "edge", "--provider", "physical", "--storage-mode", "central"],
        ],
    ) as server:
        yield server


def proof(cp: ControlPlane, m: Minion, region: str, inventory: dict[str, Any]) -> httpx.Response:
    """The minion's attested join with this inventory up to the proof: its answer, whatever it is."""
    jt = api(cp, "POST", f"/v1/regions/{region}/join-tokens", {"ttl": "1h"})["token"]
    first = m.begin(jt, PASSING, inventory=inventory)
    assert first.status_code == 201, first.text
    return m.prove(first.json(), jt)


def join(cp: ControlPlane, m: Minion, region: str, inventory: dict[str, Any]) -> dict[str, Any]:
    """The minion's attested join with this inventory: the proof's answer (credential, node id)."""
    answer = proof(cp, m, region, inventory)
    assert answer.status_code == 200 and answer.json()["state"] == "provisioning", answer.text
    return dict(answer.json())


def add_node(cp: ControlPlane, m: Minion, name: str, service: str, region: str = "edge") -> None:
    """Add node `name` of `service` (storage, device …) for this minion to `region`."""
    api(
        cp,
        "POST",
        "/v1/nodes",
        {"name": name, "region": region, "minion_id": m.minion_id, "service": service},
    )


def join_storage(cp: ControlPlane, storage: Minion, region: str = "edge", name: str = "store-e") -> None:
    """Add, join and finalize the region's storage node (a device is added only where one is)."""
    add_node(cp, storage, name, "storage", region)
    snode = join(cp, storage, region, {"gpus": []})
    finish_finalize(cp.url, snode["node_id"], snode["node_credential"])


def devices(cp: ControlPlane, region: str) -> list[dict[str, Any]]:
    query = f"/v1/nodes?service=device&region={region}&include_removed=true"
    return list(api(cp, "GET", query)["items"])


def test_refused_in_a_local_storage_region_and_before_the_storage_node_is_active(cp: ControlPlane) -> None:
    refused = cli(cp, "device", "add", "cam-l", "--region", "loc", "--minion-id", "d" * 32, ok=False)
    assert refused.returncode == 1 and refused.stderr == f"error: {LOCAL_REFUSAL}\n", refused.stderr
    with cp.client() as client:
        answer = client.post(
            "/v1/nodes", json={"name": "cam-l", "region": "loc", "minion_id": "d" * 32, "service": "device"}
        )
    assert answer.status_code == 409 and answer.json()["code"] == "device_region_local_storage", answer.text
    assert answer.json()["message"] == LOCAL_REFUSAL
    # a central region takes devices once its storage node serves (the product rules (docs/product-rules.md):
    # "configured with a
    # centralized storage node"); until then the refusal says what to add first
    early = cli(cp, "device", "add", "cam-e", "--region", "edge", "--minion-id", "d" * 32, ok=False)
    assert early.returncode == 1 and "has no storage node yet: add it first" in early.stderr
    assert devices(cp, "loc") == [] and devices(cp, "edge") == []
    bad = cli(cp, "device", "add", "Cam_1", "--region", "edge", "--minion-id", "d" * 32, ok=False)
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1, bad.stderr


def test_a_device_joins_finalizes_and_enters_active_without_maintenance(
    cp: ControlPlane, minion: Callable[[], Minion]
) -> None:
    storage, device = minion(), minion()
    join_storage(cp, storage)
    assert api(cp, "GET", "/v1/nodes/store-e")["state"] == "active"
    # `device add --wait` prints the id at once and returns when the device is active
    waiting = subprocess.Popen(
        [
            str(PROVISION),
            "device",
            "add",
            "cam-1",
            "--region",
            "edge",
            "--minion-id",
            device.minion_id,
            "--wait",
        ],
        env=cp.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        node_id = waiting.stdout.readline().strip() if waiting.stdout else ""
        assert node_id.startswith("node_"), node_id
        dnode = join(cp, device, "edge", {"gpus": [], "device": ORIN_NX})
        work = current_work(cp.url, dnode["node_id"], dnode["node_credential"])
        assert work["playbook"] == "finalize-device.yml"
        # the device mounts the region cache from the storage node, at the address its minion came from
        assert work["variables"]["rigbase_service"] == "device"
        assert work["variables"]["rigbase_nfs_server"] == "127.0.0.1", work["variables"]
        done = finish_finalize(cp.url, dnode["node_id"], dnode["node_credential"], work["generation"])
        assert done["state"] == "active", done
        _, err = waiting.communicate(timeout=60)
        assert waiting.returncode == 0, err
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.wait()
    # show: the node and the device section of its inventory
    shown = cli(cp, "device", "show", "cam-1").stdout
    for words in (
        "NVIDIA Jetson Orin NX",
        "R35.4.1",
        "5.1.2",
        "1024",
        "firmware",
        "/dev/video0, /dev/video1",
    ):
        assert words in shown, shown
    as_json = json.loads(cli(cp, "device", "show", "cam-1", "-o", "json").stdout)
    assert as_json["id"] == node_id and as_json["state"] == "active" and as_json["service"] == "device"
    assert as_json["device"] == ORIN_NX
    listed = json.loads(cli(cp, "device", "list", "--region", "edge", "--json").stdout)
    assert [(d["name"], d["state"]) for d in listed] == [("cam-1", "active")]  # not the storage node
    row = next(line for line in cli(cp, "device", "list").stdout.splitlines() if " cam-1 " in f" {line} ")
    assert "NVIDIA Jetson Orin NX" in row
    # history: new → enrolling → provisioning → active, never maintenance
    history = json.loads(cli(cp, "device", "history", "cam-1", "--json").stdout)
    assert [e["to_state"] for e in history if e["to_state"] != e["from_state"]] == [
        "new",
        "enrolling",
        "provisioning",
        "active",
    ]
    # no maintenance mode for a device; `device` commands refuse a node of another service
    refused = cli(cp, "node", "maintenance", "cam-1", "on", ok=False)
    assert refused.returncode == 1 and "devices have no maintenance mode" in refused.stderr
    other = cli(cp, "device", "show", "store-e", ok=False)
    assert other.returncode == 1 and "is a storage node, not a device" in other.stderr
    assert cli(cp, "device", "remove", "store-e", "--yes", ok=False).returncode == 1
    assert api(cp, "GET", "/v1/nodes/store-e")["state"] == "active"
    # remove: kept as removed, shown with --removed and in its history; the name is free again
    removed = json.loads(cli(cp, "device", "remove", "cam-1", "--yes", "--json").stdout)
    assert removed["state"] == "removed"
    assert "no device yet" in cli(cp, "device", "list", "--region", "edge").stdout
    assert "cam-1" in cli(cp, "device", "list", "--removed").stdout
    after = json.loads(cli(cp, "device", "history", "cam-1", "--json").stdout)
    assert after[-1]["to_state"] == "removed" and after[-1]["reason"] == "removed by operator"
    # its minion is told so at its next heartbeat
    beat = device.beat(dnode)
    assert beat.status_code == 404 and "this node was removed" in beat.json()["message"], beat.text


# ---------------------------------------------------------------- the services, on each store

ACTOR = "operator:test"


def _central_region_with_active_storage(sessions: sessionmaker[Session]) -> str:
    """Regions `loc` (local) and `edge` (central, its storage node active); the root account's id."""
    with sessions.begin() as s:
        providers.enable(s, "physical", {}, actor=ACTOR)
        region_service.create(s, "loc", provider="physical", actor=ACTOR)
        region_service.create(s, "edge", provider="physical", storage_mode="central", actor=ACTOR)
        store = nodes.add(s, "store-e", region="edge", minion_id=f"{1:032x}", service="storage", actor=ACTOR)
        for state in (NodeState.ENROLLING, NodeState.PROVISIONING, NodeState.ACTIVE):
            nodes.transition(s, store, state, actor=ACTOR)
        return root_account(s).id


def _add_device(sessions: sessionmaker[Session], name: str, n: int) -> str:
    with sessions.begin() as s:
        return nodes.add(s, name, region="edge", minion_id=f"{n:032x}", service="device", actor=ACTOR).id


def test_refusals_store_nothing_and_a_device_has_no_maintenance_step(store: Store) -> None:
    sessions: sessionmaker[Session] = store.sessions  # type: ignore[assignment]
    _central_region_with_active_storage(sessions)
    before = store.snapshot()
    with sessions() as s, pytest.raises(RuleViolation) as refused:
        nodes.add(s, "cam-l", region="loc", minion_id=f"{2:032x}", service="device", actor=ACTOR)
    assert refused.value.message == LOCAL_REFUSAL and refused.value.code == "device_region_local_storage"
    assert store.snapshot() == before
    device_id = _add_device(sessions, "cam-1", 3)
    with sessions.begin() as s:
        device = s.get(Node, device_id)
        assert device is not None and device.service == Service.DEVICE
        for state in (NodeState.ENROLLING, NodeState.PROVISIONING):
            nodes.transition(s, device, state, actor=ACTOR)
        with pytest.raises(RuleViolation, match="cannot go to maintenance"):
            nodes.transition(s, device, NodeState.MAINTENANCE, actor=ACTOR)
        nodes.transition(s, device, NodeState.ACTIVE, actor=ACTOR)
        with pytest.raises(RuleViolation, match="devices have no maintenance mode"):
            nodes.maintenance(s, "cam-1", "on", actor=ACTOR)


def test_device_days_count_every_device_that_existed_that_day(store: Store) -> None:
    sessions: sessionmaker[Session] = store.sessions  # type: ignore[assignment]
    account = _central_region_with_active_storage(sessions)
    kept = _add_device(sessions, "cam-1", 4)
    gone = _add_device(sessions, "cam-2", 5)
    with sessions.begin() as s:
        nodes.remove(s, "cam-2", actor=ACTOR)  # added and removed on the same day
        created = s.get(Node, kept)
        assert created is not None
        today = created.created_at.astimezone(UTC).date()
    with sessions() as s:
        # both existed today (the storage node is not a device); none yesterday
        assert device_days.devices_on(s, account, today) == 2
        assert device_days.device_ids_on(s, account, today) == sorted([kept, gone])
        assert device_days.devices_on(s, account, today - timedelta(days=1)) == 0
        assert device_days.devices_on(s, "acc_nobody", today) == 0
    # history moved back to a fixed week: cam-1 added Monday and removed Wednesday counts Mon, Tue, Wed;
    # cam-2 added and removed on Tuesday counts on Tuesday only
    monday = date(2026, 11, 2)
    at = {d: datetime(2026, 11, 2 + d, 12, tzinfo=UTC) for d in range(4)}
    with sessions.begin() as s:
        nodes.remove(s, "cam-1", actor=ACTOR)
        s.execute(update(Node).where(Node.id == kept).values(created_at=at[0]))
        s.execute(update(Node).where(Node.id == gone).values(created_at=at[1]))
        for node_id, removed_at in ((kept, at[2]), (gone, at[1] + timedelta(hours=1))):
            s.execute(
                update(AuditEvent)
                .where(AuditEvent.resource_id == node_id, AuditEvent.to_state == NodeState.REMOVED.value)
                .values(at=removed_at)
            )
    with sessions() as s:
        counts = [device_days.devices_on(s, account, monday + timedelta(days=d)) for d in range(-1, 4)]
    assert counts == [0, 1, 2, 1, 0]


# ---------------------------------------------------------------- the device playbook, for real


@pytest.mark.slow
def test_the_device_playbook_mounts_the_region_cache_and_touches_no_drive(root: Path, tmp_path: Path) -> None:
    """finalize-device.yml through the minion's runner into a lab root (tests/minion/test_finalize.py's
    way): the storage node's cache export goes into fstab at /data/cache, where the inference container's
    models are read; the NVMe drives the work names are left alone (a device has no scratch array)."""
    device = work(
        rigbase_service="device",
        rigbase_node_name="cam-1",
        rigbase_hostname="cam-1",
        rigbase_storage_mode="central",
        rigbase_nfs_server="10.77.0.11",
    )
    assert device.playbook == "finalize-device.yml"
    for attempt in range(2):
        events: list[FinalizeEvent] = []
        result = apply_work(
            device, BUNDLE.data, FinalizePaths(tmp_path / "state"), host_root=root, on_event=events.append
        )
        assert result.outcome.ok, result
        ran = {e.task for e in events if e.status not in (TaskStatus.SKIPPED, TaskStatus.STARTED)}
        touching = [t for t in ran if any(w in t.lower() for w in ("scratch", "raid", "drive", "sata"))]
        assert not touching and "Add the data cache to fstab" in ran, ran
        if attempt:  # a second run converges: nothing changes
            assert result.outcome.changed == 0, [e for e in events if e.status is TaskStatus.CHANGED]
    assert (root / "etc/hostname").read_text() == "cam-1\n"
    config = yaml.safe_load((root / "etc/rigbase/minion.yaml").read_text())
    assert config["service"] == "device" and config["node_name"] == "cam-1" and config["scratch"] is None
    assert not (root / "etc/rigbase/scratch.yaml").exists()
    fstab = (root / "etc/fstab").read_text().splitlines()
    assert "10.77.0.11:/scratch/cache /data/cache nfs4 defaults,_netdev,nofail,noatime 0 0" in fstab
    assert (root / "data/cache").is_dir()
    storage = yaml.safe_load((root / "etc/rigbase/storage.yaml").read_text())
    assert (storage["role"], storage["cache"]["kind"], storage["applied"]) == ("device", "nfs4", False)
