"""Storage-node provisioning against the Compute fake with the real google-cloud-compute client."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from contracts.errors import Conflict, InvalidInput
from provisioner.providers.base import ProvisionFailed
from provisioner.providers.gcp import instances, naming, storage_node
from provisioner.providers.gcp.storage_node import StorageNodeSpec

ZONES = ("us-central1-a", "us-central1-b", "us-central1-c")
BUNDLE = {
    "version": 1,
    "control_plane_url": "https://cp.example:8470",
    "ca_certificate": None,
    "region": "lab-gcp",
    "region_id": "0b9d5c1e",
    "provider": "gcp",
    "join_token": "secret-token",
    "expires_at": None,
}


IMAGE = "projects/rigbase-test/global/images/family/rigbase-lab-gcp"


def spec(**kw: Any) -> StorageNodeSpec:
    base: dict[str, Any] = dict(
        region_id="0b9d5c1e",
        region="lab-gcp",
        gcp_region="us-central1",
        zones=ZONES,
        storage_class=storage_node.storage_class("small"),
        bundle=BUNDLE,
        image=IMAGE,
    )
    base.update(kw)
    return StorageNodeSpec(**base)


def test_create_success(fake_compute: Any, compute_ctx: Any) -> None:
    node = storage_node.create(compute_ctx, spec())
    assert (node.name, node.zone, node.adopted) == ("rigbase-storage-lab-gcp", "us-central1-a", False)
    inst = fake_compute.fake.instances[("us-central1-a", node.name)]
    assert inst["shieldedInstanceConfig"] == {
        "enableSecureBoot": False,  # the UKI is not signed for the firmware; the vTPM proves the boot
        "enableVtpm": True,
        "enableIntegrityMonitoring": True,
    }
    assert inst["labels"] == {
        "rigbase-managed": "rigbase",
        "rigbase-region": "lab-gcp",
        "rigbase-region-id": "0b9d5c1e",
        "rigbase-role": "storage",
    }
    assert inst["machineType"].endswith("/machineTypes/n2-standard-8")
    scratch = [d for d in inst["disks"] if d.get("type") == "SCRATCH"]
    assert len(scratch) == 4 and all(d["initializeParams"]["diskSizeGb"] == "375" for d in scratch)
    metadata = {i["key"]: i["value"] for i in inst["metadata"]["items"]}
    assert json.loads(metadata["rigbase-bundle"]) == BUNDLE
    assert set(metadata) == {"rigbase-bundle"}  # the image's rigbase-gce-bundle.service reads it
    boot = next(d for d in inst["disks"] if d.get("boot"))
    assert boot["initializeParams"]["sourceImage"] == IMAGE and boot["autoDelete"]
    assert inst["tags"]["items"] == ["rigbase-node"]
    # ExtendedOperation.result() was never used: every wait went through our ZoneOperationsClient
    assert fake_compute.fake.calls["op_wait"] >= 1


def test_no_published_image_is_refused_before_any_insert(fake_compute: Any, compute_ctx: Any) -> None:
    with pytest.raises(ProvisionFailed, match="no rigbase image is published for this region"):
        storage_node.create(compute_ctx, spec(image=""))
    assert fake_compute.fake.calls["instance_insert"] == 0


def test_request_id_is_derived_from_our_ids() -> None:
    s = spec()
    assert s.request_id("p", "us-central1-a") == s.request_id("p", "us-central1-a")
    assert s.request_id("p", "us-central1-a") != s.request_id("p", "us-central1-b")
    assert s.request_id("p", "us-central1-a") != spec(region_id="other").request_id("p", "us-central1-a")


def test_zone_fallback(fake_compute: Any, compute_ctx: Any) -> None:
    fake_compute.fake.zone_errors["us-central1-a"] = "ZONE_RESOURCE_POOL_EXHAUSTED"
    fake_compute.fake.zone_errors["us-central1-b"] = "QUOTA_EXCEEDED"
    progress: list[str] = []
    node = storage_node.create(compute_ctx, spec(), on_progress=progress.append)
    assert node.zone == "us-central1-c"
    assert fake_compute.fake.instance_count() == 1
    assert any("ZONE_RESOURCE_POOL_EXHAUSTED" in p for p in progress)


def test_all_zones_exhausted_names_each_reason(fake_compute: Any, compute_ctx: Any) -> None:
    for zone in ZONES:
        fake_compute.fake.zone_errors[zone] = "ZONE_RESOURCE_POOL_EXHAUSTED"
    fake_compute.fake.zone_errors["us-central1-c"] = "QUOTA_EXCEEDED"
    with pytest.raises(ProvisionFailed) as err:
        storage_node.create(compute_ctx, spec())
    msg = err.value.message
    assert "us-central1-a: ZONE_RESOURCE_POOL_EXHAUSTED" in msg and "us-central1-c: QUOTA_EXCEEDED" in msg
    assert fake_compute.fake.instance_count() == 0


def test_crash_and_retry_with_same_request_id_makes_one_instance(fake_compute: Any, compute_ctx: Any) -> None:
    """The control plane dies right after insert; the restarted reconciler runs create() again while the
    operation is still running and the instance not yet visible: the same requestId gets the same
    operation back, so exactly one instance exists afterwards."""
    from google.cloud import compute_v1

    fake_compute.fake.op_duration_s = 1.0
    s = spec()
    first = compute_ctx.instances.insert_unary(
        request=compute_v1.InsertInstanceRequest(
            project=compute_ctx.project,
            zone=ZONES[0],
            instance_resource=storage_node.build_instance(s, compute_ctx.project, ZONES[0]),
            request_id=s.request_id(compute_ctx.project, ZONES[0]),
        )
    )  # ... and the process "crashes" here, before waiting
    assert fake_compute.fake.instance_count() == 0  # not visible yet: find() cannot short-circuit
    node = storage_node.create(compute_ctx, s)
    assert node.zone == ZONES[0] and not node.adopted
    assert fake_compute.fake.calls["instance_insert"] == 2
    assert fake_compute.fake.instance_count() == 1
    assert len(fake_compute.fake._ops) == 1, "the retry must reuse the first operation"
    assert first.name in fake_compute.fake._ops


def test_two_reconcilers_at_once_make_one_instance(fake_compute: Any, compute_ctx: Any) -> None:
    fake_compute.fake.op_duration_s = 0.3
    results: list[Any] = []
    threads = [
        threading.Thread(target=lambda: results.append(storage_node.create(compute_ctx, spec())))
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 3 and {r.zone for r in results} == {ZONES[0]}
    assert fake_compute.fake.instance_count() == 1


def test_rerun_after_success_adopts(fake_compute: Any, compute_ctx: Any) -> None:
    first = storage_node.create(compute_ctx, spec())
    again = storage_node.create(compute_ctx, spec())
    assert again.adopted and again.zone == first.zone
    assert fake_compute.fake.calls["instance_insert"] == 1


def test_409_already_exists_is_adopted(
    fake_compute: Any, compute_ctx: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage_node.create(compute_ctx, spec())
    calls = {"n": 0}
    real_find = instances.find

    def blind_once(ctx: Any, owned: Any) -> Any:  # the pre-check misses it (as if it appeared a moment later)
        calls["n"] += 1
        return None if calls["n"] == 1 else real_find(ctx, owned)

    monkeypatch.setattr(instances, "find", blind_once)
    fake_compute.fake._by_request_id.clear()  # beyond Compute's requestId memory: the insert answers 409
    node = storage_node.create(compute_ctx, spec())
    assert node.adopted and fake_compute.fake.instance_count() == 1


def test_foreign_instance_with_our_name_is_refused(fake_compute: Any, compute_ctx: Any) -> None:
    storage_node.create(compute_ctx, spec())
    with pytest.raises(Conflict, match="was not made for region"):
        storage_node.create(compute_ctx, spec(region_id="someone-else"))


def test_ek_public_from_shielded_identity(fake_compute: Any, compute_ctx: Any) -> None:
    node = storage_node.create(compute_ctx, spec())
    assert storage_node.ek_public(compute_ctx, node).startswith("-----BEGIN PUBLIC KEY-----")


def test_delete_removes_only_ours(fake_compute: Any, compute_ctx: Any) -> None:
    storage_node.create(compute_ctx, spec())
    fake_compute.fake.instances[("us-central1-b", "someone-elses-vm")] = {
        "name": "someone-elses-vm",
        "labels": {},
    }
    assert storage_node.delete(compute_ctx, spec()) is True
    assert list(fake_compute.fake.instances) == [("us-central1-b", "someone-elses-vm")]
    assert storage_node.delete(compute_ctx, spec()) is False  # idempotent


def test_wait_makes_at_most_two_calls_per_second(fake_compute: Any, compute_ctx: Any) -> None:
    """Even when the server answers wait() at once (no long poll), we never exceed 2 calls/s.

    Counted where the limit is, at the server: no three calls arrive within one second. (Gaps between
    two arrivals are not the measure: on a loaded machine one request reaches the server ~50 ms late
    and the next on time, so two arrivals can sit 0.50 s apart although the client kept its 0.55 s.)"""
    fake_compute.fake.wait_max_s = 0.0
    fake_compute.fake.op_duration_s = 2.0
    node = storage_node.create(compute_ctx, spec())
    waits = [t for t, name in fake_compute.fake.call_log if name == "op_wait"]
    assert node.zone == ZONES[0]
    assert len(waits) >= 3
    spans = [c - a for a, _, c in zip(waits, waits[1:], waits[2:], strict=False)]
    assert min(spans) >= 1.0, spans


def test_unknown_storage_class() -> None:
    with pytest.raises(InvalidInput, match="choose one of small, medium, large, xlarge"):
        storage_node.storage_class("huge")


def test_storage_classes_are_valid_local_ssd_counts() -> None:
    for sc in storage_node.STORAGE_CLASSES.values():
        assert sc.local_ssds in (1, 2, 4, 8, 16, 24)
        assert sc.cache_gb == sc.local_ssds * 375


def test_names_fit_gcp_limits() -> None:
    long = spec(region="r" * 80)
    assert len(long.instance_name) <= 63
    assert naming.gcp_name("Rig", "Storage", "X_y") == "rig-storage-x-y"
