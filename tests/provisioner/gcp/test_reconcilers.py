"""The gcp services and reconcilers in-process (real store on SQLite, real clients against the Compute
fake, one reconciler pass at a time): the failure paths that the end-to-end walkthrough does not reach."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from contracts.errors import RuleViolation
from provisioner.domain.states import ProviderState
from provisioner.providers.gcp import Endpoints, GcpProvider, catalogue
from provisioner.providers.gcp.events import NodeEvent, NodeEventKind
from provisioner.reconcilers.loop import ReconcilerLoop
from provisioner.services.cloud import gcp
from provisioner.services.common.runtime import Runtime, attach
from provisioner.services.fleet import region_removal
from provisioner.services.jobs import gcp_events
from provisioner.services.regions import providers as provider_service
from provisioner.settings import Settings
from provisioner.store.engine import make_engine, make_sessionmaker, session_scope
from provisioner.store.gcp_models import GcpStorageNode
from provisioner.store.migrate import upgrade
from provisioner.store.models import Node, Provider, Region
from tests.fixtures.gcp import make_sa_key
from tests.provisioner.gcp.fake_compute import quota
from tests.provisioner.gcp.published import publish_image

ZONES = catalogue.load().region("us-central1").zones


def enabled_gcp(
    url: str, tmp_path: Path, fake_compute: Any, storage: str | None = None
) -> tuple[Engine, sessionmaker[Session]]:
    """A migrated store at `url` with an enabled gcp provider against the Compute fake, whose us-central1
    has quota for 64 CPUs, 3000 GB of local SSD and 2 T4s (bootstrap is test_bootstrap's business).
    `storage`: the Cloud Storage emulator's URL. Shared with test_burst.py and test_image_publish.py; the
    caller disposes of the engine."""
    endpoints = Endpoints(compute=fake_compute.url, resource_manager=fake_compute.url, storage=storage)
    runtime = Runtime.from_settings(
        Settings(home=tmp_path / "home"), providers={"gcp": GcpProvider(endpoints=endpoints, anonymous=True)}
    )
    fake_compute.fake.region_quotas["us-central1"] = [
        quota("CPUS", 64),
        quota("LOCAL_SSD_TOTAL_GB", 3000),
        quota("NVIDIA_T4_GPUS", 2),
    ]
    engine = make_engine(url)
    upgrade(url, engine)
    sessions = attach(make_sessionmaker(engine), runtime)
    with session_scope(sessions) as s:
        prov = provider_service.enable(s, "gcp", {"credentials": json.dumps(make_sa_key())}, actor="test")
        provider_service.transition(s, prov, ProviderState.ENABLED, actor="test")
    return engine, sessions


@pytest.fixture()
def store(tmp_path: Path, fake_compute: Any) -> Iterator[sessionmaker[Session]]:
    engine, sessions = enabled_gcp(f"sqlite:///{tmp_path / 'rigbase.db'}", tmp_path, fake_compute)
    yield sessions
    engine.dispose()


def regions_pass(sessions: sessionmaker[Session]) -> None:
    ReconcilerLoop(sessions, only=["gcp-regions"]).run_once()


def create(sessions: sessionmaker[Session], *, published: bool = True) -> str:
    """Region us-central1, and (unless told otherwise) a rigbase image published for it."""
    with session_scope(sessions) as s:
        out = gcp.create_region(
            s,
            "us-central1",
            gcp_region=None,
            storage_class="small",
            public_jobs=True,
            dry_run=False,
            actor="test",
        )
        region_id = out["region"].id
    if published:
        publish_image(sessions, "us-central1", Path(tempfile.mkdtemp(prefix="image-builder-")))
    return region_id


def test_the_storage_node_waits_for_a_published_image_and_then_boots_its_family(
    store: sessionmaker[Session], fake_compute: Any, tmp_path: Path
) -> None:
    region_id = create(store, published=False)
    regions_pass(store)
    with session_scope(store) as s:
        rec = s.get_one(GcpStorageNode, region_id)
        assert rec.status == "pending"
        assert "waiting for a published rigbase image for region us-central1" in (rec.progress or "")
        assert "provision image publish DIR/manifest.json --provider gcp" in (rec.progress or "")
    assert fake_compute.fake.instance_count() == 0
    source = publish_image(store, "us-central1", tmp_path / "image-builder")
    regions_pass(store)
    assert states(store, region_id)[2] == "ready"
    (inst,) = fake_compute.fake.instances.values()
    boot = next(d for d in inst["disks"] if d.get("boot"))
    assert boot["initializeParams"]["sourceImage"] == source
    assert source == "projects/rigbase-test/global/images/family/rigbase-us-central1"
    assert inst["shieldedInstanceConfig"] == {
        "enableSecureBoot": False,
        "enableVtpm": True,
        "enableIntegrityMonitoring": True,
    }
    items = {i["key"]: i["value"] for i in inst["metadata"]["items"]}
    assert set(items) == {"rigbase-bundle"}  # the image's units read it; no startup script
    assert json.loads(items["rigbase-bundle"])["region"] == "us-central1"


def states(sessions: sessionmaker[Session], region_id: str) -> tuple[str, str, str, str | None]:
    with session_scope(sessions) as s:
        rec = s.get(GcpStorageNode, region_id)
        return (
            s.get(Region, region_id).state,
            s.get(Node, rec.node_id).state,
            rec.status,
            s.get(Region, region_id).reason,
        )


def test_every_zone_refusing_errors_node_and_region_with_the_reasons(
    store: sessionmaker[Session], fake_compute: Any
) -> None:
    for zone in ZONES:
        fake_compute.fake.zone_errors[zone] = "QUOTA_EXCEEDED"
    region_id = create(store)
    regions_pass(store)
    region, node, status, reason = states(store, region_id)
    assert (region, node, status) == ("errored", "errored", "failed")
    assert reason and all(f"{z}: QUOTA_EXCEEDED" in reason for z in ZONES)
    assert fake_compute.fake.instance_count() == 0
    # removing the errored region deletes nothing that is not ours and completes
    with session_scope(store) as s:
        region_removal.remove(s, "us-central1", actor="test")
    regions_pass(store)
    assert states(store, region_id)[:3] == ("removed", "removed", "deleted")


def test_vm_deleted_behind_our_back_errors_node_and_region(
    store: sessionmaker[Session], fake_compute: Any
) -> None:
    region_id = create(store)
    regions_pass(store)
    assert states(store, region_id)[2] == "ready"
    with session_scope(store) as s:
        name = s.get(GcpStorageNode, region_id).instance_name
    gcp_events.apply_event(
        store, NodeEvent(NodeEventKind.DELETED, "deleted", name, ZONES[0], "v1.compute.instances.delete", "t")
    )
    region, node, _status, reason = states(store, region_id)
    assert (region, node) == ("errored", "errored") and "deleted outside rigbase" in (reason or "")
    # an event about an instance that is not ours changes nothing
    gcp_events.apply_event(
        store,
        NodeEvent(
            NodeEventKind.OFFLINE, "stopped", "rigbase-other", ZONES[0], "v1.compute.instances.stop", "t"
        ),
    )
    assert states(store, region_id)[0] == "errored"


def test_zero_capacity_and_disabled_provider_are_refused_without_writes(
    store: sessionmaker[Session], fake_compute: Any
) -> None:
    fake_compute.fake.region_quotas["us-central1"] = [
        quota("CPUS", 64),
        quota("NVIDIA_T4_GPUS", 2),
    ]  # no local SSD
    with session_scope(store) as s, pytest.raises(RuleViolation, match="T4: local_ssd"):
        gcp.create_region(
            s,
            "us-central1",
            gcp_region=None,
            storage_class="small",
            public_jobs=True,
            dry_run=False,
            actor="t",
        )
    with session_scope(store) as s:
        assert s.query(Region).count() == 0 and s.query(Node).count() == 0
        s.query(Provider).one().state = "errored"
    with session_scope(store) as s, pytest.raises(Exception, match="not enabled"):
        gcp.create_region(
            s,
            "us-central1",
            gcp_region=None,
            storage_class="small",
            public_jobs=True,
            dry_run=True,
            actor="t",
        )


def test_region_health_needs_the_storage_node_active_and_reporting(store: sessionmaker[Session]) -> None:
    from datetime import datetime, timedelta

    from provisioner.domain.states import NodeState
    from provisioner.services.fleet import nodes as node_service

    region_id = create(store)
    regions_pass(store)
    with session_scope(store) as s:
        node = s.get(Node, s.get(GcpStorageNode, region_id).node_id)
        for to in (NodeState.ENROLLING, NodeState.PROVISIONING, NodeState.MAINTENANCE, NodeState.ACTIVE):
            node_service.transition(s, node, to, actor="test:join")
    regions_pass(store)
    assert states(store, region_id)[0] == "new"  # active, but its minion never reported
    with session_scope(store) as s:
        node_service.record_report(s, s.get(Node, s.get(GcpStorageNode, region_id).node_id))
    regions_pass(store)
    assert states(store, region_id)[0] == "healthy"
    # the heartbeat-based region-health reconciler leaves GCP regions to the gcp one (no flapping)
    ReconcilerLoop(store, only=["region-health"]).run_once()
    assert states(store, region_id)[0] == "healthy"
    with session_scope(store) as s:
        node_service.record_report(
            s,
            s.get(Node, s.get(GcpStorageNode, region_id).node_id),
            at=datetime.now(UTC) - timedelta(minutes=5),
        )
    regions_pass(store)
    region, _node, _status, reason = states(store, region_id)
    assert region == "offline" and reason and "has not reported for 90 s" in reason
