"""The GCP capacity rule, table-driven, with the examples of docs/product-rules.md "GCP capacity rule"."""

from __future__ import annotations

import pytest

from provisioner.providers.gcp import catalogue
from provisioner.providers.gcp.capacity import Limit, Quota, gpu_capacity

CAT = catalogue.load()
BIG = Quota(10_000, 0)


def q(**metrics: tuple[float, float] | Quota) -> dict[str, Quota]:
    return {k: v if isinstance(v, Quota) else Quota(*v) for k, v in metrics.items()}


CASES = [
    # id, gpu, quotas, runnable, limited_by, cpu_metric
    (
        "product rules: V100 quota 8, CPU quota 0",
        "V100",
        q(NVIDIA_V100_GPUS=(8, 0), CPUS=(0, 0), LOCAL_SSD_TOTAL_GB=BIG),
        0,
        Limit.CPUS,
        "CPUS",
    ),
    (
        "product rules: V100 quota 8, local SSD quota 0",
        "V100",
        q(NVIDIA_V100_GPUS=(8, 0), CPUS=BIG, LOCAL_SSD_TOTAL_GB=(0, 0)),
        0,
        Limit.LOCAL_SSD,
        "CPUS",
    ),
    (
        "product rules: V100 quota 1, plenty of both",
        "V100",
        q(NVIDIA_V100_GPUS=(1, 0), CPUS=BIG, LOCAL_SSD_TOTAL_GB=BIG),
        1,
        Limit.GPUS,
        "CPUS",
    ),
    (
        "free = limit - usage",
        "V100",
        q(NVIDIA_V100_GPUS=(8, 6), CPUS=BIG, LOCAL_SSD_TOTAL_GB=BIG),
        2,
        Limit.GPUS,
        "CPUS",
    ),
    (
        "CPUs floor: 20 free / 6 per P100 = 3",
        "P100",
        q(NVIDIA_P100_GPUS=(8, 0), CPUS=(24, 4), LOCAL_SSD_TOTAL_GB=BIG),
        3,
        Limit.CPUS,
        "CPUS",
    ),
    (
        "T4 divides by 8",
        "T4",
        q(NVIDIA_T4_GPUS=(8, 0), CPUS=(40, 0), LOCAL_SSD_TOTAL_GB=BIG),
        5,
        Limit.CPUS,
        "CPUS",
    ),
    (
        "local SSD floor: 1000 GB / 375 = 2",
        "T4",
        q(NVIDIA_T4_GPUS=(8, 0), CPUS=BIG, LOCAL_SSD_TOTAL_GB=(1500, 500)),
        2,
        Limit.LOCAL_SSD,
        "CPUS",
    ),
    (
        "A100 uses A2_CPUS when listed (12 per GPU)",
        "A100",
        q(NVIDIA_A100_GPUS=(8, 0), CPUS=(0, 0), A2_CPUS=(48, 0), LOCAL_SSD_TOTAL_GB=BIG),
        4,
        Limit.CPUS,
        "A2_CPUS",
    ),
    (
        "A100 falls back to CPUS when A2_CPUS absent",
        "A100",
        q(NVIDIA_A100_GPUS=(8, 0), CPUS=(36, 0), LOCAL_SSD_TOTAL_GB=BIG),
        3,
        Limit.CPUS,
        "CPUS",
    ),
    (
        "L4 uses G2_CPUS",
        "L4",
        q(NVIDIA_L4_GPUS=(4, 0), CPUS=(0, 0), G2_CPUS=(96, 0), LOCAL_SSD_TOTAL_GB=BIG),
        4,
        Limit.GPUS,
        "G2_CPUS",
    ),
    (
        "H100: 26 vCPU per GPU from A3_CPUS",
        "H100",
        q(NVIDIA_H100_GPUS=(8, 0), A3_CPUS=(52, 0), CPUS=BIG, LOCAL_SSD_TOTAL_GB=BIG),
        2,
        Limit.CPUS,
        "A3_CPUS",
    ),
    (
        "N1 GPU ignores a family metric",
        "V100",
        q(NVIDIA_V100_GPUS=(4, 0), A2_CPUS=BIG, CPUS=(8, 0), LOCAL_SSD_TOTAL_GB=BIG),
        1,
        Limit.CPUS,
        "CPUS",
    ),
    (
        "metric not listed counts as 0",
        "A100_80GB",
        q(CPUS=BIG, LOCAL_SSD_TOTAL_GB=BIG),
        0,
        Limit.GPUS,
        "CPUS",
    ),
    (
        "over-used quota is 0 free, not negative",
        "V100",
        q(NVIDIA_V100_GPUS=(2, 5), CPUS=BIG, LOCAL_SSD_TOTAL_GB=BIG),
        0,
        Limit.GPUS,
        "CPUS",
    ),
    (
        "tie goes to gpus first",
        "V100",
        q(NVIDIA_V100_GPUS=(2, 0), CPUS=(16, 0), LOCAL_SSD_TOTAL_GB=(750, 0)),
        2,
        Limit.GPUS,
        "CPUS",
    ),
]


@pytest.mark.parametrize(
    ("gpu", "quotas", "runnable", "limited_by", "cpu_metric"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_capacity_rule(
    gpu: str, quotas: dict[str, Quota], runnable: int, limited_by: Limit, cpu_metric: str
) -> None:
    cap = gpu_capacity(CAT.gpus[gpu], quotas)
    assert (cap.runnable_jobs, cap.limited_by, cap.cpu_metric) == (runnable, limited_by, cpu_metric)


def test_product_rules_ratios_are_in_the_catalogue() -> None:
    assert {n: CAT.gpus[n].cpus_per_gpu for n in ("P100", "V100", "T4", "A100")} == {
        "P100": 6,
        "V100": 8,
        "T4": 8,
        "A100": 12,
    }
    assert (CAT.gpus["A100"].cpu_metric, CAT.gpus["L4"].cpu_metric, CAT.gpus["H100"].cpu_metric) == (
        "A2_CPUS",
        "G2_CPUS",
        "A3_CPUS",
    )


def test_catalogue_has_ten_regions_with_zones_and_gpus() -> None:
    assert len(CAT.regions) == 10
    for region in CAT.regions.values():
        assert region.zones and all(z.startswith(region.name + "-") for z in region.zones)
        for gpu, zones in region.gpu_zones.items():
            assert set(zones) <= set(region.zones), (region.name, gpu)
        assert len(region.gpu_zones) >= 4, region.name  # "most of the common GPU types"
    for gpu in CAT.gpus.values():
        assert gpu.metric.startswith("NVIDIA_") and gpu.metric.endswith("_GPUS")
        assert gpu.price_per_gpu_hour > 0
    assert CAT.price_date and CAT.price_source.startswith("https://")


SPOT_CASES = [
    # id, quotas, (on-demand runnable, its GPU metric), (Spot runnable, its GPU, CPU and SSD metrics)
    (
        "preemptible quotas: Spot VMs spend them, on-demand VMs the standard ones",
        q(
            NVIDIA_T4_GPUS=(1, 0),
            CPUS=BIG,
            LOCAL_SSD_TOTAL_GB=BIG,
            PREEMPTIBLE_NVIDIA_T4_GPUS=(6, 2),
            PREEMPTIBLE_CPUS=(64, 0),
            PREEMPTIBLE_LOCAL_SSD_GB=(3000, 0),
        ),
        (1, "NVIDIA_T4_GPUS"),
        (4, ("PREEMPTIBLE_NVIDIA_T4_GPUS", "PREEMPTIBLE_CPUS", "PREEMPTIBLE_LOCAL_SSD_GB")),
    ),
    (
        "no preemptible quota (limit 0): Spot VMs spend the standard quotas",
        q(NVIDIA_T4_GPUS=(2, 0), CPUS=BIG, LOCAL_SSD_TOTAL_GB=BIG, PREEMPTIBLE_NVIDIA_T4_GPUS=(0, 0)),
        (2, "NVIDIA_T4_GPUS"),
        (2, ("NVIDIA_T4_GPUS", "CPUS", "LOCAL_SSD_TOTAL_GB")),
    ),
    (
        "preemptible GPUs but no preemptible CPUs: each resource on its own",
        q(NVIDIA_T4_GPUS=(0, 0), CPUS=(16, 0), LOCAL_SSD_TOTAL_GB=BIG, PREEMPTIBLE_NVIDIA_T4_GPUS=(8, 0)),
        (0, "NVIDIA_T4_GPUS"),
        (2, ("PREEMPTIBLE_NVIDIA_T4_GPUS", "CPUS", "LOCAL_SSD_TOTAL_GB")),  # 16 CPUs / 8 per T4
    ),
]


@pytest.mark.parametrize(
    ("quotas", "on_demand", "spot"), [c[1:] for c in SPOT_CASES], ids=[c[0] for c in SPOT_CASES]
)
def test_spot_capacity_is_the_preemptible_quota_where_the_project_has_one(
    quotas: dict[str, Quota], on_demand: tuple[int, str], spot: tuple[int, tuple[str, str, str]]
) -> None:
    standard = gpu_capacity(CAT.gpus["T4"], quotas)
    assert (standard.runnable_jobs, standard.metric, standard.preemptible) == (*on_demand, False)
    cap = gpu_capacity(CAT.gpus["T4"], quotas, preemptible=True)
    metrics = (cap.metric, cap.cpu_metric, cap.local_ssd_metric)
    assert (cap.runnable_jobs, metrics, cap.preemptible) == (spot[0], spot[1], True)
