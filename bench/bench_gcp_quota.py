"""GCP quota + capacity for all ten catalogue regions, concurrently, against the local Compute fake;
and how many API calls waiting on a slow operation costs.

Targets: all ten regions in < 1 s in total (SkyPilot's quota check is ≈ 1 s per region, so
≈ 10 s for ten); waiting on an operation ≤ 2 API calls per second. The fake answers instantly, so a
second run adds a modelled WAN round trip (150 ms per call) to show what concurrency buys."""

from __future__ import annotations

import statistics
import time

from bench.results import figure
from provisioner.providers.gcp import catalogue, operations, quota, storage_node
from provisioner.providers.gcp.clients import Endpoints, GcpContext
from tests.provisioner.gcp.fake_compute import FakeCompute, FakeComputeServer
from tests.provisioner.gcp.fake_compute import quota as q

SKYPILOT_S_PER_REGION = 1.0
RUNS = 5


def region_quotas(*extra: dict) -> list[dict]:
    """One region's quotas in the fake: CPUs, local SSD and each catalogue GPU, plus what a bench adds."""
    return [
        q("CPUS", 72, 8),
        q("A2_CPUS", 48),
        q("G2_CPUS", 96),
        q("LOCAL_SSD_TOTAL_GB", 6000, 375),
        q("NVIDIA_T4_GPUS", 8, 1),
        q("NVIDIA_V100_GPUS", 8),
        q("NVIDIA_P100_GPUS", 4),
        q("NVIDIA_A100_GPUS", 8),
        q("NVIDIA_L4_GPUS", 8),
        q("NVIDIA_H100_GPUS", 8),
        *extra,
    ]


def _bench_quota(latency_s: float) -> None:
    regions = list(catalogue.load().regions)
    fake = FakeCompute(region_quotas={r: region_quotas() for r in regions}, latency_s=latency_s)
    with FakeComputeServer(fake) as server:
        endpoints = Endpoints(compute=server.url)
        t0 = time.perf_counter()
        cold_ctx = GcpContext.anonymous(fake.project, endpoints)
        results = quota.fetch_many(cold_ctx, regions)
        cold = time.perf_counter() - t0
        ctx = GcpContext.anonymous(fake.project, endpoints)
        quota.fetch(
            ctx, regions[0]
        )  # build the client and open a connection once, as a running control plane has
        warm = []
        for _ in range(RUNS):
            t0 = time.perf_counter()
            quota.fetch_many(ctx, regions)
            warm.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for r in regions:
            quota.fetch(ctx, r)
        sequential = time.perf_counter() - t0
    jobs = sum(g.runnable_jobs for r in results for g in r.gpus)
    median = statistics.median(warm)
    sky = SKYPILOT_S_PER_REGION * len(regions)
    print(
        f"quota+capacity, {len(regions)} regions, modelled latency {latency_s * 1000:.0f} ms/call "
        f"({jobs} runnable jobs found):"
    )
    print(
        f"  concurrent, cold (new clients)  {cold:7.3f} s   target < 1 s: {'met' if cold < 1 else 'MISSED'}"
    )
    print(
        f"  concurrent, warm (median of {RUNS})  {median:7.3f} s   "
        f"target < 1 s: {'met' if median < 1 else 'MISSED'}"
    )
    print(
        f"  sequential, warm               {sequential:7.3f} s   "
        f"concurrency speed-up {sequential / median:5.1f}x"
    )
    figure(
        f"quota + capacity, {len(regions)} regions concurrently, warm",
        median,
        "s",
        target=1.0,
        note=f"{latency_s * 1000:.0f} ms per call modelled",
    )
    figure(
        "the same, cold (new clients)",
        cold,
        "s",
        target=1.0,
        note=f"{latency_s * 1000:.0f} ms per call modelled",
    )
    print(
        f"  SkyPilot ≈ {SKYPILOT_S_PER_REGION:.0f} s/region (SkyPilot's published figure, not run here) "
        f"= {sky:.0f} s  -> ours is {sky / median:,.0f}x faster (warm), {sky / cold:,.0f}x (cold)"
    )


def _bench_wait(wait_max_s: float, op_duration_s: float) -> None:
    fake = FakeCompute(op_duration_s=op_duration_s, wait_max_s=wait_max_s)
    spec = storage_node.StorageNodeSpec(
        region_id="bench",
        region="bench",
        gcp_region="us-central1",
        zones=("us-central1-a",),
        storage_class=storage_node.storage_class("small"),
        bundle={"version": 1},
        image=f"projects/{fake.project}/global/images/family/rigbase-bench",
    )
    with FakeComputeServer(fake) as server:
        ctx = GcpContext.anonymous(fake.project, Endpoints(compute=server.url))
        t0 = time.perf_counter()
        storage_node.create(ctx, spec)
        elapsed = time.perf_counter() - t0
    waits = [t for t, name in fake.call_log if name == "op_wait"]
    span = (waits[-1] - waits[0]) if len(waits) > 1 else 0.0
    rate = (len(waits) - 1) / span if span else 0.0
    print(
        f"  server {'answers wait() at once' if wait_max_s == 0 else f'long-polls {wait_max_s:.0f} s'}: "
        f"{len(waits)} wait calls for a {op_duration_s:.0f} s operation ({elapsed:.1f} s total), "
        f"{rate:.2f} calls/s  target ≤ 2: {'met' if rate <= 2.0 else 'MISSED'}; "
        f"all calls: {sum(fake.calls.values())}"
    )
    server = "answering wait() at once" if wait_max_s == 0 else f"long-polling {wait_max_s:.0f} s"
    figure(f"waiting on a slow GCP operation, the server {server}", rate, "calls/s", target=2.0)


def main() -> None:
    t0 = time.perf_counter()
    import google.cloud.compute_v1  # noqa: F401  (a one-off per process; kept out of the per-call figures)

    print(
        f"importing google-cloud-compute: {time.perf_counter() - t0:.2f} s (once per control-plane process)"
    )
    _bench_quota(0.0)
    _bench_quota(0.150)
    print(
        "waiting on a slow insert operation "
        f"(ZoneOperationsClient.wait, {operations.MIN_INTERVAL_S} s floor between calls):"
    )
    _bench_wait(wait_max_s=0.0, op_duration_s=4.0)
    _bench_wait(wait_max_s=2.0, op_duration_s=4.0)


if __name__ == "__main__":
    main()
