"""CloudBender's capacity rule: how many 1-GPU jobs a region's quota allows, and what limits it.

runnable jobs per GPU type = floor(min(free GPUs, free CPUs / CPUs-per-GPU, free local SSD GB / 375)),
free = limit - usage. The CPU metric is the GPU family's own (A2_CPUS, G2_CPUS, A3_CPUS) when the family
has one AND the region lists it, else CPUS (N1 machines, and projects where the family metric is absent).

Spot VMs draw on a region's preemptible quotas (PREEMPTIBLE_NVIDIA_T4_GPUS, PREEMPTIBLE_CPUS,
PREEMPTIBLE_LOCAL_SSD_GB) where the project has them, and on the standard ones where it does not: Google
counts a Spot VM against the preemptible quota of a resource only when that quota's limit is above zero.
So each resource of a Spot VM is looked up on its own (`spot_metric`): a project with preemptible GPUs
but no preemptible CPU quota spends preemptible GPUs and standard CPUs.
Pure functions over plain numbers so the rule is table-tested without any client."""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from provisioner.providers.gcp.catalogue import GpuType

LOCAL_SSD_PARTITION_GB = 375  # one GCP local SSD partition; every job gets one for scratch
LOCAL_SSD_METRIC = "LOCAL_SSD_TOTAL_GB"
CPUS_METRIC = "CPUS"
# the preemptible twin of each standard metric a Spot VM spends (GPUs: PREEMPTIBLE_ + the GPU's metric)
PREEMPTIBLE_PREFIX = "PREEMPTIBLE_"
PREEMPTIBLE_CPUS_METRIC = "PREEMPTIBLE_CPUS"  # every family's Spot vCPUs (there is no PREEMPTIBLE_A2_CPUS)
PREEMPTIBLE_LOCAL_SSD_METRIC = "PREEMPTIBLE_LOCAL_SSD_GB"


class Limit(enum.StrEnum):
    """Which factor bounds the runnable jobs (ties go to the first in this order: GPUs, CPUs, SSD)."""

    GPUS = "gpus"
    CPUS = "cpus"
    LOCAL_SSD = "local_ssd"


@dataclass(frozen=True)
class Quota:
    limit: float
    usage: float

    @property
    def free(self) -> float:
        # a quota over-used (usage > limit after a limit decrease) has nothing free, not a negative amount
        return max(0.0, self.limit - self.usage)


@dataclass(frozen=True)
class GpuCapacity:
    gpu: str
    preemptible: bool  # the capacity of Spot VMs (preemptible quotas where the project has them)
    metric: str
    gpu_limit: float
    gpu_usage: float
    gpu_free: float
    cpu_metric: str
    cpus_free: float
    cpus_per_gpu: int
    jobs_by_cpus: float
    local_ssd_metric: str
    local_ssd_free_gb: float
    local_ssd_gb_per_job: int
    jobs_by_local_ssd: float
    runnable_jobs: int
    limited_by: Limit

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["limited_by"] = self.limited_by.value
        return data


def cpu_metric_for(gpu: GpuType, quotas: Mapping[str, Quota]) -> str:
    """The family metric when the GPU's family has one and the region lists it, else CPUS."""
    if gpu.cpu_metric and gpu.cpu_metric in quotas:
        return gpu.cpu_metric
    return CPUS_METRIC


def spot_metric(preemptible_metric: str, standard_metric: str, quotas: Mapping[str, Quota]) -> str:
    """The metric a Spot VM spends for one resource: the preemptible one where its limit is above zero."""
    quota = quotas.get(preemptible_metric)
    return preemptible_metric if quota is not None and quota.limit > 0 else standard_metric


@dataclass(frozen=True)
class Metrics:
    """The three quota metrics one VM of a GPU type spends."""

    gpus: str
    cpus: str
    local_ssd: str


def metrics_for(gpu: GpuType, quotas: Mapping[str, Quota], preemptible: bool = False) -> Metrics:
    standard = Metrics(gpu.metric, cpu_metric_for(gpu, quotas), LOCAL_SSD_METRIC)
    if not preemptible:
        return standard
    return Metrics(
        spot_metric(PREEMPTIBLE_PREFIX + gpu.metric, standard.gpus, quotas),
        spot_metric(PREEMPTIBLE_CPUS_METRIC, standard.cpus, quotas),
        spot_metric(PREEMPTIBLE_LOCAL_SSD_METRIC, standard.local_ssd, quotas),
    )


def gpu_capacity(gpu: GpuType, quotas: Mapping[str, Quota], preemptible: bool = False) -> GpuCapacity:
    """Capacity for one GPU type (of Spot VMs when `preemptible`); a metric the region does not list
    counts as a quota of 0."""
    none = Quota(0.0, 0.0)
    metrics = metrics_for(gpu, quotas, preemptible)
    g = quotas.get(metrics.gpus, none)
    cpus_free = quotas.get(metrics.cpus, none).free
    ssd_free = quotas.get(metrics.local_ssd, none).free
    factors = {
        Limit.GPUS: g.free,
        Limit.CPUS: cpus_free / gpu.cpus_per_gpu,
        Limit.LOCAL_SSD: ssd_free / LOCAL_SSD_PARTITION_GB,
    }
    limited_by = min(factors, key=lambda k: factors[k])  # dict order breaks ties: gpus, cpus, local_ssd
    return GpuCapacity(
        gpu=gpu.name,
        preemptible=preemptible,
        metric=metrics.gpus,
        gpu_limit=g.limit,
        gpu_usage=g.usage,
        gpu_free=g.free,
        cpu_metric=metrics.cpus,
        cpus_free=cpus_free,
        cpus_per_gpu=gpu.cpus_per_gpu,
        jobs_by_cpus=factors[Limit.CPUS],
        local_ssd_metric=metrics.local_ssd,
        local_ssd_free_gb=ssd_free,
        local_ssd_gb_per_job=LOCAL_SSD_PARTITION_GB,
        jobs_by_local_ssd=factors[Limit.LOCAL_SSD],
        runnable_jobs=math.floor(factors[limited_by]),
        limited_by=limited_by,
    )


def region_capacity(
    gpus: list[GpuType], quotas: Mapping[str, Quota], preemptible: bool = False
) -> list[GpuCapacity]:
    return [gpu_capacity(gpu, quotas, preemptible) for gpu in gpus]
