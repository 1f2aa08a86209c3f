"""Heartbeats through HAProxy to one and to three control-plane hosts on one PostgreSQL: the highest rate
each shape answers with p99 under 50 ms.

How it is built (tests/fixtures/scale_out.py, the shape test_scale_out tests): every host is a network
namespace running `provision serve`, HAProxy (Debian's) is a fourth and the fleet a fifth, all on one
virtual LAN; PostgreSQL is a throw-away cluster (fsync off) reached through its Unix socket. The fleet is
the fleet benchmark's client (bench/beat_client.py: the minion's bytes, one kept connection per node) in
the minions' namespace, sending steady beats at each rate in turn, open loop, latency from each beat's
scheduled time. Both shapes share this machine's cores with PostgreSQL, HAProxy and the client, so the
ratio says what a host adds here, not what a host of its own would: on a machine of two cores, three
hosts have no core more than one.

    .venv/bin/python -m bench scale_out
    .venv/bin/python -m bench scale_out --nodes 1000 --rates 50,100 --seconds 5
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.beat_client import PerNodeClient, StreamBeatClient, Target
from bench.bench_fleet_heartbeats import GOAL_P99_MS, SimNode, Tally, _pct, drive, seed, unit_of_work_ms
from bench.harness import options_from_argv, sigterm_unwinds
from bench.results import figure
from minion.join.tls_resume import ResumingContext

HEARTBEAT_S = 30.0
QUIET = {"RIGBASE_QUOTE_EVERY": "10000019"}  # steady beats only: the seeded counters reach no multiple


def _arguments(argv: Sequence[str]) -> argparse.Namespace:
    env = os.environ.get
    parser = argparse.ArgumentParser(prog="bench scale_out", description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=int(env("RIGBASE_BENCH_NODES", "3000")))
    parser.add_argument("--rates", default=env("RIGBASE_BENCH_RATES", "100,200,300,400"))
    parser.add_argument("--seconds", type=float, default=float(env("RIGBASE_BENCH_SECONDS", "15")))
    parser.add_argument("--connections", type=int, default=64, help="beats in flight at once at most")
    args, _ = parser.parse_known_args(list(argv))
    args.rates = sorted(float(r) for r in args.rates.split(",") if r.strip())
    if not args.rates or args.nodes < 1 or args.seconds <= 0:
        parser.error("--rates takes beats/s separated by commas; --nodes and --seconds positive")
    return args


def _load(
    url: str, ca: str, nodes: list[SimNode], rates: list[float], seconds: float, flight: int
) -> list[Any]:
    """In the minions' namespace: every node opens its connection, then each rate for `seconds`; per rate
    (rate, answered/s, p50, p99, errors)."""

    async def go() -> list[Any]:
        client = PerNodeClient(Target(url, ResumingContext(ca), 1), StreamBeatClient)
        out = []
        try:
            await drive(client, nodes, 200.0, len(nodes) / 200.0, Tally(), [0], flight)  # connections open
            cursor = [0]
            for rate in rates:
                tally = Tally()
                elapsed = await drive(client, nodes, rate, seconds, tally, cursor, flight)
                lat = tally.latencies_ms
                out.append(
                    (
                        rate,
                        len(lat) / elapsed,
                        statistics.median(lat) if lat else float("nan"),
                        _pct(lat, 0.99),
                        sum(tally.errors.values()),
                    )
                )
        finally:
            await client.aclose()
        return out

    return asyncio.run(go())


def run(args: argparse.Namespace) -> None:
    from tests.fixtures.postgres import PostgresCluster
    from tests.fixtures.scale_out import control_plane_hosts

    print(
        f"scale out: {args.nodes} nodes, each on its own kept connection, through HAProxy; rates "
        f"{', '.join(f'{r:.0f}' for r in args.rates)} beats/s, {args.seconds:.0f} s each; "
        f"{os.cpu_count()} CPUs shared by every host, PostgreSQL, HAProxy and the client"
    )
    best: dict[int, float] = {}
    with ExitStack() as stack:
        stack.enter_context(sigterm_unwinds())
        tmp = Path(tempfile.mkdtemp(prefix="rigbase-bench-scale-"))
        stack.callback(shutil.rmtree, tmp, True)
        cluster = stack.enter_context(PostgresCluster())
        url = cluster.create_database()
        nodes = seed(url, args.nodes, 1_000_000)
        for count in (1, 3):
            started = time.perf_counter()
            with control_plane_hosts(
                tmp / f"hosts-{count}", cluster, url, count, QUIET, HEARTBEAT_S
            ) as shape:
                print(f"  -- {count} host(s) behind HAProxy (up in {time.perf_counter() - started:.1f} s)")
                steps = shape.minions.call(
                    _load,
                    shape.url,
                    shape.ca,
                    nodes,
                    args.rates,
                    args.seconds,
                    args.connections,
                    timeout=3600,
                )
            for rate, answered, p50, p99, errors in steps:
                holds = p99 < GOAL_P99_MS and answered >= 0.95 * rate and not errors
                print(
                    f"    {rate:.0f} beats/s: answered {answered:.0f}/s, p50 {p50:.1f} ms, p99 {p99:.1f} ms, "
                    f"errors {errors}" + ("" if holds else "  (does not hold)")
                )
                if holds:
                    best[count] = max(best.get(count, 0.0), rate)
            held = best.get(count, 0.0)
            print(f"    the highest rate held with p99 under {GOAL_P99_MS:.0f} ms: {held:.0f} beats/s")
            figure(f"{count} host(s) behind HAProxy: the highest rate held at p99 < 50 ms", held, "beats/s")
        # the machine's speed, to compare days by: the beat's unit of work alone, in process
        uow = unit_of_work_ms(url, tmp / "hosts-1" / "cp11", nodes)
        if uow is not None:
            print(f"  the machine's speed: the heartbeat's unit of work alone, in process: {uow:.2f} ms CPU")
            figure("the heartbeat's unit of work alone, in process (the machine's speed)", uow, "ms")
    one, three = best.get(1, 0.0), best.get(3, 0.0)
    ratio = three / one if one else float("nan")
    print(f"  three hosts against one: {ratio:.2f}x the rate")
    figure("three hosts against one: the rate held", ratio, "x")


def main(argv: Sequence[str] | None = None) -> None:
    run(_arguments(options_from_argv(sys.argv[1:]) if argv is None else argv))


if __name__ == "__main__":
    main()
