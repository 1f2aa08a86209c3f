"""Join burst benchmark: N minions (default 1,000), each with its OWN swtpm process
and EK, start the attested join at the same instant against one control-plane host and then against three
(`--hosts 1,3`), each shape behind HAProxy on one throw-away PostgreSQL cluster, as docs/control-plane.md
"Several hosts" deploys it (tests/fixtures/scale_out.py: every host, HAProxy and the minions a network
namespace of their own); none was added as a node, so each ends pending (202). Measured per shape: the
time from the start signal until every minion is pending, joins/s, and the ratio to the 60 s goal; then
three hosts against one.

What the figure includes: both join steps over HTTPS (POST /v1/join, then the proof: TPM2_ActivateCredential
and TPM2_Quote on the minion's swtpm), the server's EK chain, credential and quote checks and its writes.
Not included: manufacturing the TPM states (swtpm_setup, ~0.7 s each, once, cached in
$RIGBASE_BENCH_CACHE, shared with bench_join), starting the swtpm processes (parallel batches of
`--batch`) and creating each minion's AK. On a real fleet each minion's TPM work runs on its own machine;
here all N swtpms share the hosts' two cores, so the swtpm CPU is printed beside the servers'. On a
machine of two cores three hosts have no core more than one: the ratio says what the shape costs or
gains here, not what hosts of their own would. Every swtpm process is stopped at the end, also on Ctrl-C
or SIGTERM.

    .venv/bin/python -m bench join_burst                       # full size: 1,000 minions, 1 and 3 hosts
    .venv/bin/python -m bench join_burst --minions 20          # a quick look
    RIGBASE_BENCH_MINIONS=20 RIGBASE_BENCH_HOSTS=3 .venv/bin/python -m bench join_burst
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import ssl
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.bench_join import manufacture, start_copy
from bench.harness import options_from_argv, sigterm_unwinds, tree_cpu_s
from bench.results import figure

os.environ.setdefault("TSS2_LOG", "all+none")  # tpm2-tss logs harmless NV probes otherwise

GOAL_S = 60.0
KEEPALIVE_S = 2.0  # the minions' idle keep-alive, below uvicorn's 5 s
TRANSPORT_RETRIES = 2  # joins restarted after a transport error, before it counts as an error


@dataclass
class Outcome:
    status: int | str  # the proof's HTTP status, or the error
    answered_s: float  # seconds after the start signal


class BurstMinion:
    """One minion: its swtpm, a TPM session with its AK, its own HTTPS client (its own connection)."""

    def __init__(self, tpm: Any, url: str, token: str, verify: Any) -> None:
        from minion.tpm.session import TpmSession

        self.tpm = tpm
        self.session = TpmSession(tpm.tcti)
        self.session.open()
        self.ak = self.session.create_ak()
        self.minion_id = self.session.endorsement_key().minion_id
        # Keep-alive shorter than the server's (uvicorn closes an idle connection after 5 s): a proof sent
        # on a connection the server is closing at that instant gets "Server disconnected" instead of an
        # answer, and between the two steps this minion's swtpm may be busy for longer than that.
        self.http = httpx.Client(
            base_url=url, timeout=300, verify=verify, limits=httpx.Limits(keepalive_expiry=KEEPALIVE_S)
        )
        self.token = token
        self.retries = 0

    def join(self) -> int | str:
        """Both steps, restarted after a transport error as `minion run` restarts them (at most
        TRANSPORT_RETRIES times; counted): the proof's status (202: pending), or its refusal."""
        for _ in range(TRANSPORT_RETRIES):
            try:
                return self._join_once()
            except httpx.TransportError:
                self.retries += 1
        return self._join_once()

    def _join_once(self) -> int | str:
        from minion.join.attest import join_request, parse_challenge, proof_payload

        body = join_request(
            self.session,
            self.ak,
            join_token=self.token,
            inventory={"gpus": [{"model": "NVIDIA GeForce RTX 4090", "memory_mib": 24564}]},
            requirements={"ok": True, "rules": []},
        )
        first = self.http.post("/v1/join", json=body)
        first.raise_for_status()
        challenge = parse_challenge(first.json())
        proof = self.http.post(
            f"/v1/join/{challenge.join_id}/proof",
            json=proof_payload(self.session, self.ak, challenge),
            headers={"Authorization": f"Bearer {self.token}"},
        )
        if proof.status_code >= 400:
            return f"HTTP {proof.status_code}: {proof.text[:160]}"
        return proof.status_code

    def close(self) -> None:
        self.session.close()
        self.http.close()


# ---------------------------------------------------------------- swtpm processes


@contextmanager
def swtpm_fleet(golden: Sequence[Any], work: Path, batch: int) -> Iterator[list[Any]]:
    """Start a copy of every state (in parallel batches); stop and delete every one on the way out,
    whatever happens (Ctrl-C and SIGTERM included)."""
    started: list[Any] = []
    lock = threading.Lock()

    def start(i: int) -> Any:
        tpm = start_copy(golden[i], work / f"m-{i:04d}")
        with lock:
            started.append(tpm)
        return tpm

    try:
        with ThreadPoolExecutor(batch) as pool:
            yield list(pool.map(start, range(len(golden))))
    finally:
        with ThreadPoolExecutor(batch) as pool:
            list(pool.map(lambda tpm: tpm.remove(), started))


def swtpm_rss_mib(tpms: Sequence[Any]) -> float:
    """The swtpm processes' resident memory together (a real fleet has one TPM per machine)."""
    total_kib = 0
    for pid in (t.pid() for t in tpms):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except (OSError, TypeError):
            continue
        total_kib += next(
            (int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0
        )
    return total_kib / 1024


def swtpm_cpu_s(tpms: Sequence[Any]) -> float:
    return sum(tree_cpu_s(pid) for pid in (t.pid() for t in tpms) if pid is not None)


# ---------------------------------------------------------------- the burst


def burst(minions: Sequence[BurstMinion]) -> tuple[list[Outcome], float]:
    """All minions start joining at one instant (a thread each); their outcomes and the start time."""
    gate = threading.Barrier(len(minions) + 1)
    outcomes: list[Outcome | None] = [None] * len(minions)
    start = [0.0]

    def go(i: int, m: BurstMinion) -> None:
        gate.wait()
        try:
            status: int | str = m.join()
        except Exception as exc:
            status = f"{type(exc).__name__}: {exc}"[:200]
        outcomes[i] = Outcome(status, time.perf_counter() - start[0])

    threads = [threading.Thread(target=go, args=(i, m), daemon=True) for i, m in enumerate(minions)]
    for th in threads:
        th.start()
    start[0] = time.perf_counter()
    gate.wait()
    for th in threads:
        th.join()
    return [o for o in outcomes if o is not None], start[0]


def count_pending(database_url: str, minion_ids: set[str]) -> int:
    """How many of these minions the store holds as attested pending minions (read straight from it: the
    pending list route looks up each row's node, which would load the server while it is measured)."""
    from sqlalchemy import select

    from provisioner.store.engine import make_engine
    from provisioner.store.join_models import PendingMinion

    engine = make_engine(database_url)
    try:
        with engine.connect() as c:
            rows = c.execute(select(PendingMinion.minion_id).where(PendingMinion.attested.is_(True)))
            return sum(1 for (minion_id,) in rows if minion_id in minion_ids)
    finally:
        engine.dispose()


def _arguments(argv: Sequence[str]) -> argparse.Namespace:
    env = os.environ.get
    parser = argparse.ArgumentParser(prog="bench join_burst", description=__doc__.split("\n")[0])
    parser.add_argument("--minions", type=int, default=int(env("RIGBASE_BENCH_MINIONS", "1000")))
    parser.add_argument(
        "--hosts", default=env("RIGBASE_BENCH_HOSTS", "1,3"), help="control-plane hosts, one shape each"
    )
    parser.add_argument(
        "--batch", type=int, default=int(env("RIGBASE_BENCH_BATCH", "16")), help="swtpms started at once"
    )
    args, _ = parser.parse_known_args(list(argv))  # a neighbour's options pass through
    try:
        args.hosts = [int(h) for h in args.hosts.split(",") if h.strip()]
    except ValueError:
        parser.error(f"--hosts takes counts separated by commas (got {args.hosts!r})")
    if args.minions < 1 or args.batch < 1 or not args.hosts or min(args.hosts) < 1:
        parser.error("--minions, --batch and every --hosts count must be at least 1")
    return args


def _setup(url: str, ca_file: str, admin: str, vendor: Any) -> str:
    """Provider, region, the vendor CA; a join token good for the burst (run in the minions' namespace)."""
    headers = {"Authorization": f"Bearer {admin}"}
    with httpx.Client(base_url=url, verify=ssl.create_default_context(cafile=ca_file), headers=headers) as c:
        c.post("/v1/providers", json={"kind": "physical"}).raise_for_status()
        c.post("/v1/regions", json={"name": "burst", "provider": "physical"}).raise_for_status()
        pem = b"".join(vendor.certificate_pems()).decode()
        c.post("/v1/tpm-cas", json={"pem": pem}).raise_for_status()
        return str(c.post("/v1/regions/burst/join-tokens", json={"ttl": "2h"}).json()["token"])


def _parallel(pool_size: int, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
    with ThreadPoolExecutor(pool_size) as pool:
        return list(pool.map(fn, items))


@dataclass
class Burst:
    """What one burst gave: every outcome, the minions' ids, restarted joins, and the CPU seconds of the
    control-plane hosts, the swtpms and the minions' client side during it."""

    outcomes: list[Outcome]
    minion_ids: set[str]
    retries: int
    cpu: tuple[float, float, float]
    swtpm_mib: float


def _burst_from(
    tpms: Sequence[Any], url: str, token: str, ca_file: str, servers: Sequence[int], batch: int
) -> Burst:
    """In the minions' namespace: a minion per swtpm (AK made, not timed), then the burst."""
    verify = ssl.create_default_context(cafile=ca_file)
    minions: list[BurstMinion] = []
    try:
        minions += _parallel(batch, lambda tpm: BurstMinion(tpm, url, token, verify), tpms)
        cpu0 = (sum(tree_cpu_s(p) for p in servers), swtpm_cpu_s(tpms), sum(os.times()[:2]))
        outcomes, _ = burst(minions)
        cpu1 = (sum(tree_cpu_s(p) for p in servers), swtpm_cpu_s(tpms), sum(os.times()[:2]))
    finally:
        _parallel(batch, BurstMinion.close, minions)
    cpu = (cpu1[0] - cpu0[0], cpu1[1] - cpu0[1], cpu1[2] - cpu0[2])
    ids = {m.minion_id for m in minions}
    return Burst(outcomes, ids, sum(m.retries for m in minions), cpu, swtpm_rss_mib(tpms))


def _one_shape(args: argparse.Namespace, count: int, golden: Sequence[Any], vendor: Any) -> float | None:
    """The burst against `count` hosts behind HAProxy; the seconds until all were pending (None: not all)."""
    from tests.fixtures.postgres import PostgresCluster
    from tests.fixtures.scale_out import control_plane_hosts

    with ExitStack() as stack:
        work = Path(tempfile.mkdtemp(prefix="rigbase-bench-burst-"))
        stack.callback(shutil.rmtree, work, True)
        cluster = stack.enter_context(PostgresCluster())
        url = cluster.create_database()
        t = time.monotonic()
        shape = stack.enter_context(control_plane_hosts(work / "hosts", cluster, url, count, {}, 30.0))
        first = shape.hosts[0].home
        admin = json.loads((first / "client.json").read_text())["token"]
        ca_file = str(first / "tls" / "ca.pem")
        token = shape.minions.call(_setup, shape.url, ca_file, admin, vendor)
        print(f"  -- {count} host(s) behind HAProxy (up in {time.monotonic() - t:.1f} s)")
        t = time.monotonic()
        tpms = stack.enter_context(swtpm_fleet(golden, work, args.batch))
        servers = [h.proc.pid for h in shape.hosts if h.proc is not None]
        done: Burst = shape.minions.call(
            _burst_from, tpms, shape.url, token, ca_file, servers, args.batch, timeout=3600
        )
        print(
            f"    {len(tpms)} swtpm processes started and AKs created in batches of {args.batch} "
            f"({time.monotonic() - t:.1f} s with the burst; {done.swtpm_mib:.0f} MiB resident together)"
        )
        pending = count_pending(url, done.minion_ids)
    return _report(args, count, done, pending)


def run(args: argparse.Namespace) -> None:
    cache = Path(os.environ.get("RIGBASE_BENCH_CACHE", "/tmp/rigbase-bench-swtpm"))
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"join burst: {args.minions} minions, each with its own swtpm, join at once against "
        f"{' and then '.join(str(h) for h in args.hosts)} control-plane host(s) behind HAProxy on "
        f"PostgreSQL; {os.cpu_count()} CPUs, load average {load}"
    )
    t = time.monotonic()
    vendor, golden = manufacture(cache, args.minions)
    print(f"  {len(golden)} swtpm states ready ({time.monotonic() - t:.0f} s, cached in {cache})")
    taken: dict[int, float | None] = {}
    with sigterm_unwinds():
        for count in args.hosts:
            taken[count] = _one_shape(args, count, golden, vendor)
    one, three = taken.get(1), taken.get(3)
    if one and three:
        print(f"  three hosts against one: {one / three:.2f}x the joins per second")
        figure("join burst: three hosts against one, joins per second", one / three, "x")


def _report(args: argparse.Namespace, count: int, done: Burst, pending: int) -> float | None:
    outcomes, cpu = done.outcomes, done.cpu
    statuses = Counter(o.status if isinstance(o.status, int) else "error" for o in outcomes)
    errors = [o.status for o in outcomes if not isinstance(o.status, int) or o.status != 202]
    all_s = max(o.answered_s for o in outcomes)
    times = sorted(o.answered_s for o in outcomes)
    whole = pending == args.minions and not errors
    print(
        f"    answers: {dict(statuses)}; pending in the store afterwards: {pending}/{args.minions}; "
        f"joins restarted after a transport error: {done.retries}"
        + (f"; first error: {errors[0]}" if errors else "")
    )
    print(
        f"    all {args.minions} pending after {all_s:.1f} s ({args.minions / all_s:.1f} joins/s); "
        f"half after {statistics.median(times):.1f} s"
    )
    print(
        f"    CPU during the burst: the host(s) {cpu[0]:.1f} s ({100 * cpu[0] / all_s:.0f} % of one core), "
        f"the {args.minions} swtpms {cpu[1]:.1f} s, the minions' client side {cpu[2]:.1f} s"
    )
    hosts = "one host" if count == 1 else f"{count} hosts"
    figure(
        f"join burst: {args.minions:,} minions, each with its own swtpm, {hosts} behind HAProxy, all pending",
        all_s,
        "s",
        target=GOAL_S,
        note="" if whole else "NOT all pending",
    )
    figure(f"the same: half pending ({hosts})", statistics.median(times), "s")
    print(f"    time / {GOAL_S:.0f} s goal = {all_s / GOAL_S:.2f}" + ("" if whole else "  (NOT all pending)"))
    return all_s if whole else None


def main(argv: Sequence[str] | None = None) -> None:
    run(_arguments(options_from_argv(sys.argv[1:]) if argv is None else argv))


if __name__ == "__main__":
    main()
