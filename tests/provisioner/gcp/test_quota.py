"""`region quota`: RegionsClient.get against the Compute fake, and a saved gcloud Region JSON offline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from contracts.errors import InvalidInput, Unavailable
from provisioner.providers.gcp import quota
from tests.provisioner.gcp.fake_compute import quota as q


def test_fetch_reads_quotas_with_the_real_client(fake_compute: Any, compute_ctx: Any) -> None:
    fake_compute.fake.region_quotas["us-central1"] = [
        q("CPUS", 72, 8),
        q("A2_CPUS", 24, 0),
        q("LOCAL_SSD_TOTAL_GB", 3000, 0),
        q("NVIDIA_V100_GPUS", 8, 1),
        q("NVIDIA_A100_GPUS", 4, 0),
        q("NVIDIA_H100_GPUS", 8, 0),
    ]
    result = quota.fetch(compute_ctx, "us-central1")
    doc = result.to_json()
    assert doc["region"] == "us-central1"
    by_metric = {g["metric"]: g for g in doc["gpus"]}
    assert (
        by_metric["NVIDIA_V100_GPUS"]["runnable_jobs"] == 7
        and by_metric["NVIDIA_V100_GPUS"]["limited_by"] == "gpus"
    )
    # A100: A2_CPUS listed -> 24 / 12 = 2 jobs, limited by cpus
    assert (by_metric["NVIDIA_A100_GPUS"]["runnable_jobs"], by_metric["NVIDIA_A100_GPUS"]["limited_by"]) == (
        2,
        "cpus",
    )
    assert by_metric["NVIDIA_A100_GPUS"]["cpu_metric"] == "A2_CPUS"
    # H100: A3_CPUS not listed -> CPUS (64 free) / 26 = 2
    assert (by_metric["NVIDIA_H100_GPUS"]["runnable_jobs"], by_metric["NVIDIA_H100_GPUS"]["cpu_metric"]) == (
        2,
        "CPUS",
    )
    assert all(isinstance(g["runnable_jobs"], int) for g in doc["gpus"])
    assert json.loads(json.dumps(doc)) == doc  # --json output is plain JSON
    assert result.runnable
    assert fake_compute.fake.calls["region_get"] == 1  # one call gives every quota


def test_unknown_region_is_refused_before_any_call(fake_compute: Any, compute_ctx: Any) -> None:
    with pytest.raises(InvalidInput, match="not in rigbase's catalogue"):
        quota.fetch(compute_ctx, "mars-north1")
    assert sum(fake_compute.fake.calls.values()) == 0


def test_api_error_becomes_one_line(fake_compute: Any, compute_ctx: Any) -> None:
    with pytest.raises(Unavailable, match="reading quotas of us-east1 failed"):
        quota.fetch(compute_ctx, "us-east1")  # the fake answers 404 for a region it does not know


def test_from_gcloud_json_offline(saved_region: Path) -> None:
    result = quota.from_json_file(saved_region)
    by_gpu = {g.gpu: g for g in result.gpus}
    assert by_gpu["V100"].runnable_jobs == 7 and by_gpu["V100"].gpu_free == 7
    assert by_gpu["A100"].runnable_jobs == 2 and by_gpu["A100"].cpu_metric == "A2_CPUS"


def test_zero_capacity_everywhere_says_why(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text(
        json.dumps(
            {"name": "europe-west4", "quotas": [{"metric": "NVIDIA_V100_GPUS", "limit": 8, "usage": 0}]}
        )
    )
    result = quota.from_json_file(path)
    assert not result.runnable
    msg = result.why_not_runnable()
    assert "V100: cpus" in msg and "quota increase" in msg


def test_preemptible_quota_alone_is_capacity_for_spot_vms(tmp_path: Path) -> None:
    """No standard T4 quota but preemptible T4s: none on demand, Spot VMs can run (region create goes on)."""
    path = tmp_path / "r.json"
    quotas = [
        {"metric": "PREEMPTIBLE_NVIDIA_T4_GPUS", "limit": 4, "usage": 0},
        {"metric": "CPUS", "limit": 64, "usage": 0},
        {"metric": "LOCAL_SSD_TOTAL_GB", "limit": 3000, "usage": 0},
    ]
    path.write_text(json.dumps({"name": "us-central1", "quotas": quotas}))
    result = quota.from_json_file(path)
    on_demand = {g.gpu: g.runnable_jobs for g in result.gpus}
    spot = {g.gpu: (g.runnable_jobs, g.metric) for g in result.spot}
    assert on_demand["T4"] == 0 and spot["T4"] == (4, "PREEMPTIBLE_NVIDIA_T4_GPUS")
    assert result.runnable


@pytest.mark.parametrize(
    "content", ["{", json.dumps({"quotas": []}), json.dumps({"name": "x", "quotas": [{"limit": 1}]})]
)
def test_bad_saved_file_is_refused(tmp_path: Path, content: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(InvalidInput):
        quota.from_json_file(path)


def test_all_ten_regions_concurrently(fake_compute: Any, compute_ctx: Any) -> None:
    from provisioner.providers.gcp import catalogue

    names = list(catalogue.load().regions)
    for name in names:
        fake_compute.fake.region_quotas[name] = [
            q("CPUS", 64),
            q("LOCAL_SSD_TOTAL_GB", 3000),
            q("NVIDIA_T4_GPUS", 4),
        ]
    results = quota.fetch_many(compute_ctx, names)
    assert [r.region for r in results] == names
    assert all({g.gpu: g.runnable_jobs for g in r.gpus}["T4"] == 4 for r in results)


def test_saved_file_for_another_region_is_refused(saved_region: Path) -> None:
    with pytest.raises(InvalidInput, match="describes us-central1, not us-east1"):
        quota.from_json_file(saved_region, "us-east1")
