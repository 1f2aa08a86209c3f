"""Fleet heartbeat benchmark: 10,000 nodes heartbeating every 30 s (≈ 333 beats/s)
against ONE control plane (`provision serve`, TLS, a throw-away PostgreSQL cluster), every K-th beat of a
node carrying a TPM2 quote the server verifies. Goal: p99 < 50 ms.

How it is built:
- The nodes are written straight into the store (as if they had joined): each has a software-held ECC
  P-256 AK made by this benchmark (`cryptography`) with the AK attributes a TPM gives, a node credential
  and a recorded PCR baseline (record mode). Its quotes are real TPMS_ATTEST/TPMT_SIGNATURE structures
  signed by that key, which the server checks exactly as it checks a TPM's (signature, nonce, PCR
  selection and digest, PCR baseline). Joins stay on swtpm (bench/bench_join_burst.py); swtpm would
  cost more CPU per quote than the server under test, on the same two cores.
- The server asks each node for a quote every K-th beat (RIGBASE_QUOTE_EVERY=K) and the node answers
  on its next beat, as a minion does. Beat counters are seeded so 1/K of the nodes are asked in each
  30 s cycle; the nodes asked "in the cycle before" the measurement are asked in a warm-up pass (also
  opening the connections), so quotes flow at 1/K of the beats from the first measured second.
- Load: one asyncio client (bench/beat_client.py: HTTP/1.1 on asyncio streams over TLS, a connection
  per node, at most `--connections` beats in flight; `--client httpx` for httpx.AsyncClient) sends
  beats at a fixed arrival rate (open loop), with the minion's bytes and its TLS session resumption. A
  minion keeps its connection from beat to beat (the server keeps an idle one two beats and 15 s) and
  lets it go after its lifetime (minion/join/client.py CONNECTION_LIFETIME_S, ± 25 %: about 21 beats at
  30 s), its last beat asking the server to close it, so that behind a load balancer a restarted host
  gets its share back. One run measures four modes side by side against the same server (`--modes`),
  each but the storm first opening every node's connection, as a steady fleet holds them: `kept`, never
  let go; `resumed`, the minion's own (each connection part-way through its life at the start, so the
  fleet reconnects at its steady rate); `full`, the same with full handshakes (a minion's next
  connection reaching another host behind HAProxy); and `storm`, a new resumed connection every beat,
  a whole fleet reconnecting. `--reconnect-every N` lets the resumed and full connections go after N
  beats instead.
  Latency is measured from each beat's scheduled time, so a server that falls behind shows it. The
  server runs on core 0 (taskset), the client on the others.
- Where the time goes: the server's CPU (from /proc/<pid>/stat), PostgreSQL's and the client's, then a
  py-spy sample of the server (when py-spy is installed) over `--profile-seconds` more of the same load,
  summarised by layer and by hottest functions.

    .venv/bin/python -m bench fleet_heartbeats                    # full size: 10,000 nodes, 60 s
    .venv/bin/python -m bench fleet_heartbeats --nodes 200 --rate 50 --seconds 10
    RIGBASE_BENCH_NODES=200 RIGBASE_BENCH_RATE=50 .venv/bin/python -m bench fleet_heartbeats
"""

from __future__ import annotations

import argparse
import asyncio
import asyncio.sslproto
import base64
import collections
import hashlib
import json
import os
import random
import shutil
import ssl
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from bench.beat_client import CLIENTS, BeatClient, BeatError, PerNodeClient, Target
from bench.harness import options_from_argv, sigterm_unwinds, tree_cpu_s
from bench.results import figure
from contracts.attestation import ATTESTED_PCRS
from contracts.jobs import JobsActual
from contracts.messages import QuoteMessage, to_wire
from minion.join.client import CONNECTION_LIFETIME_JITTER, CONNECTION_LIFETIME_S
from minion.join.tls_resume import ResumingContext
from provisioner.api.tuning import SERVE_HTTP, SERVE_LOOP, TLS_READ_BUFFER

GOAL_P99_MS = 50.0
GOAL_NODES = 10_000
HEARTBEAT_S = 30.0
SOURCE_NOTE = "quotes from software AK keys, joins stay on swtpm"
# How a beat's connection is made, measured side by side in one run
MODES = {
    "kept": "one connection from beat to beat, never let go",
    "resumed": "as a minion does: each connection let go after its lifetime (--reconnect-every), the next "
    "resuming its TLS session",
    "full": "the same with full handshakes (behind HAProxy a minion's next connection may reach another "
    "host, which cannot resume its session)",
    "storm": "a new connection every beat, resuming: a whole fleet reconnecting at once",
}

# TPM 2.0 constants (Part 2) for the structures the server parses (provisioner/attestation/tpm_structures.py)
_ALG_SHA256, _ALG_NULL, _ALG_ECDSA, _ALG_ECC, _CURVE_P256 = 0x000B, 0x0010, 0x0018, 0x0023, 0x0003
_TPM_GENERATED, _ST_ATTEST_QUOTE = 0xFF544347, 0x8018
# fixedTPM | fixedParent | sensitiveDataOrigin | userWithAuth | restricted | sign: a TPM-made AK
_AK_ATTRIBUTES = (1 << 1) | (1 << 4) | (1 << 5) | (1 << 6) | (1 << 16) | (1 << 18)


def _tpm2b(data: bytes) -> bytes:
    return struct.pack(">H", len(data)) + data


def _pcr_bitmap(indices: Sequence[int]) -> bytes:
    bitmap = bytearray(3)
    for i in indices:
        bitmap[i // 8] |= 1 << (i % 8)
    return bytes(bitmap)


class SoftAk:
    """An attestation key held in software: the TPM2B_PUBLIC a TPM would report for an ECC P-256 ECDSA
    AK, and TPM2_Quote's output (TPMS_ATTEST signed into a TPMT_SIGNATURE) over a nonce."""

    def __init__(self) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        numbers = self.key.public_key().public_numbers()
        self.public_area = (
            struct.pack(">HHI", _ALG_ECC, _ALG_SHA256, _AK_ATTRIBUTES)
            + _tpm2b(b"")  # authPolicy
            + struct.pack(">H", _ALG_NULL)  # symmetric
            + struct.pack(">HH", _ALG_ECDSA, _ALG_SHA256)  # signing scheme
            + struct.pack(">H", _CURVE_P256)
            + struct.pack(">H", _ALG_NULL)  # kdf
            + _tpm2b(numbers.x.to_bytes(32, "big"))
            + _tpm2b(numbers.y.to_bytes(32, "big"))
        )
        self.name = struct.pack(">H", _ALG_SHA256) + hashlib.sha256(self.public_area).digest()
        self.clock = 0

    @property
    def tpm2b_public(self) -> bytes:
        return _tpm2b(self.public_area)

    def quote(self, nonce: bytes, pcrs: dict[int, bytes]) -> dict[str, Any]:
        """The QuoteMessage wire form of a quote over `nonce` and the sha256 `pcrs` (ascending)."""
        indices = sorted(pcrs)
        self.clock += 30_000
        attest = (
            struct.pack(">IH", _TPM_GENERATED, _ST_ATTEST_QUOTE)
            + _tpm2b(self.name)
            + _tpm2b(nonce)
            + struct.pack(">QIIB", self.clock, 1, 0, 1)  # clock, resetCount, restartCount, safe
            + struct.pack(">Q", 0x2019_1023)  # firmwareVersion
            + struct.pack(">IHB", 1, _ALG_SHA256, 3)
            + _pcr_bitmap(indices)
            + _tpm2b(hashlib.sha256(b"".join(pcrs[i] for i in indices)).digest())
        )
        r, s = decode_dss_signature(self.key.sign(attest, ec.ECDSA(hashes.SHA256())))
        signature = (
            struct.pack(">HH", _ALG_ECDSA, _ALG_SHA256)
            + _tpm2b(r.to_bytes(32, "big"))
            + _tpm2b(s.to_bytes(32, "big"))
        )
        return to_wire(QuoteMessage(attest=attest, signature=signature, pcrs=pcrs))


# what each beat reports (`actual`), as a minion in maintenance with nothing to serve or run does: its jobs
# agent reports its (no) workers on every beat (minion/jobs/agent.py JobsAgent.actual)
ACTUAL: dict[str, Any] = {
    "maintenance": True,
    "reservations": [],
    "finalize": {"state": "applied"},
    "jobs": JobsActual().model_dump(mode="json"),
}


@dataclass
class SimNode:
    index: int
    node_id: str
    credential: str
    ak: SoftAk
    pcrs: dict[int, bytes]
    nonce: bytes | None = None  # the last quote nonce the server handed this node
    revision: str | None = None  # the desired state's revision it holds, echoed as the real minion does
    busy: bool = False


# ---------------------------------------------------------------- seeding the store


def _seed_counter(i: int, every: int) -> int:
    """The node's beat count at the start: K-1 for the nodes primed in the warm-up (i % K == 0, whose
    warm-up beat is a due one), K - (i % K) for the others, so after the warm-up the counters are spread
    evenly over the K phases and 1/K of the nodes are asked for a quote in every cycle."""
    r = i % every
    return every - 1 if r == 0 else every - r


def seed(url: str, count: int, every: int) -> list[SimNode]:
    """Migrate, enable the physical provider, create a region and write `count` joined nodes in
    maintenance with their attestation rows."""
    from sqlalchemy import insert

    from provisioner.services.fleet import node_address, node_credentials
    from provisioner.services.regions import providers, regions
    from provisioner.store.engine import make_engine, make_sessionmaker
    from provisioner.store.join_models import NodeAttestation
    from provisioner.store.migrate import upgrade
    from provisioner.store.models import Node, new_id

    engine = make_engine(url)
    upgrade(url, engine)
    pcrs = {i: hashlib.sha256(f"pcr {i}".encode()).digest() for i in ATTESTED_PCRS}
    nodes = [
        SimNode(i, new_id("node"), node_credentials.new_credential(), SoftAk(), pcrs) for i in range(count)
    ]
    now = datetime.now(UTC)
    with make_sessionmaker(engine).begin() as s:
        providers.enable(s, "physical", {}, actor="bench")
        region = regions.create(s, "fleet", provider="physical", actor="bench")
        for start in range(0, count, 2000):
            batch = nodes[start : start + 2000]
            s.execute(
                insert(Node),
                [
                    dict(
                        id=n.node_id,
                        name=f"f{n.index:05d}",
                        region_id=region.id,
                        minion_id=f"{n.index:032x}",
                        service="compute",
                        hostname=None,
                        upnp=True,
                        mining=False,
                        state="maintenance",
                        reason=None,
                        # as after its first beats: what it reports is already stored (the load
                        # client's address too), so each measured beat writes what a steady one does
                        inventory={
                            "gpus": [{"model": "NVIDIA GeForce RTX 4090", "memory_mib": 24564}] * 4,
                            node_address.KEY: "127.0.0.1",
                        },
                        finalize_actual=ACTUAL["finalize"],
                        requirements={"ok": True, "rules": []},
                        last_heartbeat_at=now,
                        heartbeats=_seed_counter(n.index, every),
                        created_at=now,
                        updated_at=now,
                        version=1,
                    )
                    for n in batch
                ],
            )
            s.execute(
                insert(NodeAttestation),
                [
                    dict(
                        node_id=n.node_id,
                        ek_sha256=hashlib.sha256(n.node_id.encode()).hexdigest(),
                        ak_public=n.ak.tpm2b_public,
                        pcr_record={str(k): v.hex() for k, v in pcrs.items()},
                        credential_sha256=node_credentials.digest(n.credential),
                        attested_at=now,
                        last_quote_at=now - timedelta(seconds=random.uniform(0, every * HEARTBEAT_S)),
                    )
                    for n in batch
                ],
            )
    engine.dispose()
    return nodes


# ---------------------------------------------------------------- CPU from /proc


# ---------------------------------------------------------------- SQL per beat, from PostgreSQL's statistics

TableCounts = dict[
    str, tuple[int, int, int, int]
]  # table → (index scans, sequential scans, inserts, updates)


async def table_activity(database_url: str) -> TableCounts:
    """PostgreSQL's cumulative per-table counters, once the server's backends have reported them (a
    backend flushes its statistics within a second of going idle)."""
    import psycopg

    await asyncio.sleep(1.5)
    dsn = database_url.replace("postgresql+psycopg://", "postgresql://")
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        rows = await (
            await conn.execute(
                "SELECT relname, coalesce(idx_scan, 0), seq_scan, n_tup_ins, n_tup_upd "
                "FROM pg_stat_user_tables"
            )
        ).fetchall()
    return {str(r[0]): (int(r[1]), int(r[2]), int(r[3]), int(r[4])) for r in rows}


def summarise_tables(before: TableCounts, after: TableCounts, beats: int) -> list[str]:
    """Per beat: the scans (index and sequential; an UPDATE by key is one too) and the rows inserted or
    updated, per table, during the run (the reconcilers' passes included)."""
    per: list[tuple[float, str]] = []
    for table, counts in after.items():
        d = [b - a for a, b in zip(before.get(table, (0, 0, 0, 0)), counts, strict=True)]
        if beats and sum(d) / beats >= 0.01:
            reads, writes = (d[0] + d[1]) / beats, (d[2] + d[3]) / beats
            per.append((reads + writes, f"{table} {reads:.2f} scans + {writes:.2f} row writes"))
    total = sum(n for n, _ in per)
    shown = "; ".join(text for _, text in sorted(per, reverse=True)) or "none recorded"
    return [f"  SQL per beat (pg_stat_user_tables): {total:.1f} table scans and row writes: {shown}"]


# ---------------------------------------------------------------- the unit of work alone


def unit_of_work_ms(
    database_url: str, home: Path, nodes: Sequence[SimNode], beats: int = 1000
) -> float | None:
    """CPU per beat, in this process, of the heartbeat's unit of work alone: the function the route runs in
    its worker thread (provisioner/api/routes/join.py `_beat`: the holder query, the reports, the
    update, the commit, the answer's JSON), without HTTP, TLS or ASGI around it. One steady beat (no quote
    asked or carried) for each of `beats` nodes with no quote outstanding, after 100 to warm up;
    None when fewer than `beats` such nodes are left to measure (a small run's figure would be noise)."""
    import provisioner.api.app  # noqa: F401  (registers every desired-state contributor and reporter)
    from contracts.messages import HeartbeatRequest
    from provisioner.api.routes.join import _beat as unit_of_work
    from provisioner.services.common.heartbeat_timing import HeartbeatTiming
    from provisioner.services.common.runtime import Runtime, attach
    from provisioner.settings import Settings
    from provisioner.store.engine import make_engine, make_sessionmaker

    steady = [n for n in nodes if n.nonce is None and not n.busy][: beats + 100]
    if len(steady) < beats + 100:
        return None
    engine = make_engine(database_url)
    with _environment({"RIGBASE_HOME": str(home)}):
        sessions = attach(make_sessionmaker(engine), Runtime.from_settings(Settings.load()))
    timing = HeartbeatTiming(interval_s=HEARTBEAT_S, quote_every=10**6)  # nothing asked, nothing stale
    body = HeartbeatRequest.model_validate({"version": 1, "actual": ACTUAL})
    try:
        for n in steady[:100]:
            unit_of_work(sessions, n.node_id, n.credential, body, "127.0.0.1", timing)
        start = time.process_time()
        for n in steady[100:]:
            unit_of_work(sessions, n.node_id, n.credential, body, "127.0.0.1", timing)
        return 1000 * (time.process_time() - start) / beats
    finally:
        engine.dispose()


# ---------------------------------------------------------------- the load


@dataclass
class Tally:
    latencies_ms: list[float] = field(default_factory=list)
    quote_latencies_ms: list[float] = field(default_factory=list)
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    quotes: int = 0
    sent: int = 0


# A beat still unsent this long after its time is dropped (counted): its node would be sending the next.
LATE_S = HEARTBEAT_S
LATE = "not sent: waited a whole heartbeat interval for a connection (the server fell behind)"


async def _beat(
    client: BeatClient,
    node: SimNode,
    scheduled: float,
    tally: Tally | None,
    sending: asyncio.Semaphore,
) -> None:
    """One beat, sent once one of the client's connections is free (`sending`: as many as connections).
    The beats queue on that semaphore, not in httpx's connection pool, whose every hand-over scans all
    requests queued in it: with thousands queued (a server behind a 333 beats/s open loop) the load
    client spent its core on that scan and sent nothing, which is how the 10,000-node run hung."""
    try:
        async with sending:
            if time.perf_counter() - scheduled > LATE_S:
                if tally is not None:
                    tally.sent += 1
                    tally.errors[LATE] += 1
                return
            await _send(client, node, scheduled, tally)
    finally:
        node.busy = False


async def _send(client: BeatClient, node: SimNode, scheduled: float, tally: Tally | None) -> None:
    body: dict[str, Any] = {"version": 1, "actual": ACTUAL}
    if node.revision is not None:
        body["desired_revision"] = node.revision
    nonce, node.nonce = node.nonce, None
    if nonce is not None:
        body["quote"] = node.ak.quote(nonce, node.pcrs)
    try:
        status, answer = await client.post(f"/v1/nodes/{node.node_id}/heartbeat", body, node.credential)
        done = time.perf_counter()
        if status != 200:
            error = f"HTTP {status}: {answer[:120].decode(errors='replace')}"
        else:
            reply = json.loads(answer)
            error = "" if reply["state"] == "maintenance" else f"node {reply['state']}: {reply['reason']}"
            asked = reply.get("quote_nonce")
            node.nonce = base64.b64decode(asked) if asked else None
            node.revision = reply.get("desired_revision")
    except BeatError as exc:
        done, error = time.perf_counter(), str(exc)[:160]
    if tally is None:
        return
    tally.sent += 1
    if error:
        tally.errors[error] += 1
        return
    latency = (done - scheduled) * 1000
    tally.latencies_ms.append(latency)
    if nonce is not None:
        tally.quotes += 1
        tally.quote_latencies_ms.append(latency)


async def drive(
    client: BeatClient,
    order: Sequence[SimNode],
    rate: float,
    seconds: float,
    tally: Tally | None,
    cursor: list[int],
    connections: int,
) -> float:
    """Send beats to `order` round-robin (from `cursor`) at `rate`/s for `seconds`, at most `connections`
    at once; the elapsed time (until the last answer, or LATE_S past the last beat's time)."""
    sending = asyncio.Semaphore(connections)
    loop_start = time.perf_counter()
    count = int(rate * seconds)
    pending: set[asyncio.Task[None]] = set()
    for k in range(count):
        scheduled = loop_start + k / rate
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        node = order[cursor[0] % len(order)]
        cursor[0] += 1
        if node.busy:  # its last beat is still out: a minion beats one at a time
            if tally is not None:
                tally.errors["skipped: the node's previous beat was still unanswered"] += 1
            continue
        node.busy = True
        task = asyncio.create_task(_beat(client, node, scheduled, tally, sending))
        pending.add(task)
        task.add_done_callback(pending.discard)
    if pending:
        await asyncio.gather(*pending)
    return time.perf_counter() - loop_start


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


# ---------------------------------------------------------------- where the time goes (py-spy)

# First match wins, checked from the innermost frame outwards: the layer a CPU sample is spent in.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("TLS (ssl)", ("ssl.py", "_ssl")),
    (
        "quote verification (provisioner/attestation, cryptography)",
        ("provisioner/attestation/", "cryptography/"),
    ),
    ("PostgreSQL driver (psycopg)", ("psycopg/", "psycopg_")),
    ("SQLAlchemy ORM / Core", ("sqlalchemy/",)),
    ("pydantic (validation, serialisation)", ("pydantic", "contracts/")),
    ("JSON", ("json/",)),
    (
        "rigbase services (heartbeat, desired state, finalize …)",
        ("provisioner/services/", "provisioner/store/"),
    ),
    ("FastAPI / Starlette / anyio", ("fastapi/", "starlette/", "anyio/")),
    ("uvicorn / HTTP parsing (h11, httptools)", ("uvicorn/", "h11/", "httptools")),
    ("asyncio event loop", ("asyncio/", "selectors.py")),
    ("rigbase API layer", ("provisioner/api/",)),
)


def profile(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes] | None:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        return None
    return subprocess.Popen(
        [
            spy,
            "record",
            "--pid",
            str(pid),
            "--subprocesses",
            "--duration",
            str(int(seconds)),
            "--rate",
            "200",
            "--gil",
            "--nonblocking",
            "--format",
            "raw",
            "--output",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _function(frame: str) -> str:
    """`beat (services/fleet/heartbeat.py:53)` → `beat (provisioner/services/fleet/heartbeat.py)`."""
    name, _, where = frame.partition(" (")
    return f"{name} ({where.rsplit(':', 1)[0]})" if where else name


def summarise_profile(raw: Path, top: int = 12) -> Iterator[str]:
    """Lines: the share of the server's GIL-holding samples per layer, then the hottest functions."""
    layers: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = stack.split(";")
        layer = next(
            (name for frame in reversed(frames) for name, marks in LAYERS if any(m in frame for m in marks)),
            "other",
        )
        layers[layer] += count
        own[_function(frames[-1])] += count
        for function in {_function(f) for f in frames if "provisioner/" in f}:
            inclusive[function] += count
    if not total:
        yield "  (py-spy took no samples)"
        return
    yield f"  server CPU by layer (py-spy --gil, {total} samples; innermost frame's layer):"
    for name, count in layers.most_common():
        yield f"    {100 * count / total:5.1f} %  {name}"
    yield "  rigbase functions, inclusive (share of samples with the function on the stack):"
    for name, count in inclusive.most_common(top):
        yield f"    {100 * count / total:5.1f} %  {name}"
    yield "  hottest functions, self time:"
    for name, count in own.most_common(top):
        yield f"    {100 * count / total:5.1f} %  {name}"


# ---------------------------------------------------------------- main


def _arguments(argv: Sequence[str]) -> argparse.Namespace:
    env = os.environ.get
    parser = argparse.ArgumentParser(prog="bench fleet_heartbeats", description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=int(env("RIGBASE_BENCH_NODES", str(GOAL_NODES))))
    parser.add_argument(
        "--rate",
        type=float,
        default=float(env("RIGBASE_BENCH_RATE", "0")),
        help="beats/s (default: nodes / 30 s)",
    )
    parser.add_argument("--seconds", type=float, default=float(env("RIGBASE_BENCH_SECONDS", "60")))
    parser.add_argument("--quote-every", type=int, default=int(env("RIGBASE_BENCH_QUOTE_EVERY", "10")))
    parser.add_argument(
        "--connections",
        type=int,
        default=int(env("RIGBASE_BENCH_CONNECTIONS", "8")),
        help="beats in flight at once at most (each node has a connection of its own)",
    )
    parser.add_argument(
        "--profile-seconds",
        type=float,
        default=float(env("RIGBASE_BENCH_PROFILE_SECONDS", "15")),
        help="py-spy sample of the server after the measurement (0: none)",
    )
    parser.add_argument(
        "--profile-out", type=Path, default=None, help="keep py-spy's raw samples (collapsed stacks) here"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=int(env("RIGBASE_BENCH_WORKERS", "1")),
        help="`provision serve --workers N` (N > 1: not pinned, all cores shared)",
    )
    parser.add_argument(
        "--client",
        choices=tuple(CLIENTS),
        default=env("RIGBASE_BENCH_CLIENT", "streams"),
        help="the load client: HTTP/1.1 on asyncio streams (default) or httpx.AsyncClient",
    )
    parser.add_argument(
        "--modes",
        default=env("RIGBASE_BENCH_MODES", ",".join(MODES)),
        help="comma-separated, measured in this order: " + "; ".join(f"{k}: {v}" for k, v in MODES.items()),
    )
    parser.add_argument(
        "--reconnect-every",
        type=int,
        default=int(env("RIGBASE_BENCH_RECONNECT_EVERY", "0")),
        help="the resumed and full modes: a new TLS connection after every N beats (0: as a minion, "
        f"after each connection's lifetime, {CONNECTION_LIFETIME_S:.0f} s ± "
        f"{100 * CONNECTION_LIFETIME_JITTER:.0f} %%)",
    )
    parser.add_argument("--no-pin", action="store_true", help="do not pin the server to core 0")
    args, _ = parser.parse_known_args(list(argv))  # a neighbour's options pass through
    args.rate = args.rate or args.nodes / HEARTBEAT_S
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not args.modes or set(args.modes) - set(MODES) or args.reconnect_every < 0:
        parser.error(f"--modes takes {', '.join(MODES)}; --reconnect-every 0 or more")
    if args.nodes < args.quote_every or args.rate <= 0 or args.seconds <= 0:
        parser.error("--nodes must be at least --quote-every, --rate and --seconds positive")
    return args


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run(args: argparse.Namespace) -> None:
    from tests.fixtures.control_plane import start_control_plane
    from tests.fixtures.postgres import PostgresCluster

    cycle_s = args.nodes / args.rate
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"fleet heartbeats: {args.nodes} nodes at {args.rate:.0f} beats/s (each node every {cycle_s:.0f} s) "
        f"for {args.seconds:.0f} s, a quote every {args.quote_every}th beat; {SOURCE_NOTE}"
    )
    layout = (
        f"`provision serve --workers {args.workers}`, all cores shared"
        if args.workers > 1
        else "one `provision serve` process, cores shared"
        if args.no_pin
        else "one `provision serve` process on core 0, the load client on the others, PostgreSQL unpinned"
    )
    print(f"  machine: {os.cpu_count()} CPUs, load average {load} (other work inflates p99)")
    print(
        f"  server: {layout}; TLS on loopback, a connection per node, at most {args.connections} beats in "
        "flight "
        f"({args.client} client, the minion's bytes); PostgreSQL: a throw-away cluster (fsync off)"
    )
    if cycle_s > 50:
        print("  warning: a node beats less often than every 50 s: its quote nonce (60 s) may expire")

    with ExitStack() as stack:
        stack.enter_context(sigterm_unwinds())  # the server and PostgreSQL stop on SIGTERM too
        tmp = Path(tempfile.mkdtemp(prefix="rigbase-bench-fleet-"))
        stack.callback(shutil.rmtree, tmp, True)
        cluster = stack.enter_context(PostgresCluster())
        url = cluster.create_database()
        t = time.perf_counter()
        nodes = seed(url, args.nodes, args.quote_every)
        print(
            f"  seeded {len(nodes)} joined nodes with software AKs in PostgreSQL "
            f"({time.perf_counter() - t:.1f} s)"
        )
        server_env = {"RIGBASE_QUOTE_EVERY": str(args.quote_every), "RIGBASE_HEARTBEAT_S": str(HEARTBEAT_S)}
        stack.enter_context(_environment(server_env))  # start_control_plane hands os.environ on
        workers = ("--workers", str(args.workers)) if args.workers > 1 else ()
        pin = None if args.no_pin or args.workers > 1 else 0
        cp = stack.enter_context(start_control_plane(tmp / "home", url, pin_cpu=pin, extra_args=workers))
        cores = os.cpu_count() or 1
        if pin is not None and cores > 1:  # the client off the server's core, for the run only
            stack.callback(os.sched_setaffinity, 0, os.sched_getaffinity(0))
            os.sched_setaffinity(0, set(range(1, cores)))
        postmaster = int((cluster.data / "postmaster.pid").read_text().split()[0])
        asyncio.sslproto.SSLProtocol.max_size = TLS_READ_BUFFER  # this process holds a connection per node
        summary = []
        for i, mode in enumerate(args.modes):
            summary.append(f"  -- {_how_connected(args, mode)}")
            summary += asyncio.run(
                _load(args, mode, i == 0, nodes, cp.url, cp.verify, cp.process.pid, postmaster, url, tmp)
            )
        uow = unit_of_work_ms(url, tmp / "home", nodes)
        if uow is not None:
            figure("the heartbeat's unit of work alone, in process (the machine's speed)", uow, "ms")
            summary.append(
                f"  the heartbeat's unit of work alone, in process (no HTTP, TLS or ASGI; steady beats): "
                f"{uow:.2f} ms CPU per beat"
            )
    for line in summary:
        print(line)


async def _load(
    args: argparse.Namespace,
    mode: str,
    first: bool,
    nodes: list[SimNode],
    url: str,
    verify: ssl.SSLContext,
    server_pid: int,
    postmaster: int,
    database_url: str,
    tmp: Path,
) -> list[str]:
    if mode != "full":  # the minion's own context, resuming; the same CA
        verify = ResumingContext(ssl.DER_cert_to_PEM_cert(verify.get_ca_certs(binary_form=True)[0]))
    every = {"kept": 0, "storm": 1}.get(mode, args.reconnect_every)
    lifetime = 0.0 if mode in ("kept", "storm") else CONNECTION_LIFETIME_S
    target = Target(
        url, verify, 1, reconnect_every=every, lifetime_s=lifetime, interval_s=HEARTBEAT_S, partway=True
    )
    client = PerNodeClient(target, CLIENTS[args.client])
    try:
        # the server's own background work (reconcilers), without beats
        idle0 = tree_cpu_s(server_pid)
        await asyncio.sleep(3)
        idle_pct = 100 * (tree_cpu_s(server_pid) - idle0) / 3
        # a steady fleet holds its connections; a storm has none yet
        held = await hold(client, nodes, server_pid, first) if mode != "storm" else []
        # warm-up: the nodes asked for a quote "in the cycle before" (connections open on the way)
        primed = [n for n in nodes if n.index % args.quote_every == 0]
        warm = Tally()
        await drive(client, primed, args.rate, len(primed) / args.rate, warm, [0], args.connections)
        if warm.errors:
            return [f"  warm-up failed: {dict(warm.errors)}"]
        asked = sum(1 for n in primed if n.nonce)
        tally, cursor = Tally(), [0]
        tables0 = await table_activity(database_url)
        cpu0 = (tree_cpu_s(server_pid), tree_cpu_s(postmaster), sum(os.times()[:2]))
        elapsed = await drive(client, nodes, args.rate, args.seconds, tally, cursor, args.connections)
        cpu1 = (tree_cpu_s(server_pid), tree_cpu_s(postmaster), sum(os.times()[:2]))
        tables1 = await table_activity(database_url)
        lines = _report(
            args, mode, tally, elapsed, [b - a for a, b in zip(cpu0, cpu1, strict=True)], asked, len(primed)
        )
        lines.insert(-1, f"  server CPU with no beats (its reconcilers): {idle_pct:.0f} % of one core")
        lines[-1:-1] = held
        if isinstance(verify, ResumingContext):
            lines.insert(
                -1,
                f"  TLS: {verify.counts.connections} connections opened, {verify.counts.resumed} of them "
                "resumed a session (warm-up included)",
            )
        lines += summarise_tables(tables0, tables1, tally.sent)
        if args.profile_seconds > 0 and first:
            raw = args.profile_out or tmp / "server.pyspy.txt"
            spy = profile(server_pid, args.profile_seconds, raw)
            if spy is None:
                lines.append("  where the time goes: py-spy is not installed (.venv/bin/pip install py-spy)")
            else:
                await drive(
                    client, nodes, args.rate, args.profile_seconds + 1, None, cursor, args.connections
                )
                _, err = spy.communicate(timeout=120)
                if raw.exists():
                    lines += summarise_profile(raw)
                else:
                    lines.append(f"  py-spy failed: {err.decode().strip()[-300:]}")
    finally:
        await client.aclose()
    return lines


def _rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmRSS:", 1)[1].split()[0])


async def hold(client: BeatClient, nodes: Sequence[SimNode], server_pid: int, first: bool) -> list[str]:
    """Each node beats once on a connection of its own and keeps it, as a fleet of minions does between
    beats: what the server's memory grows by for each connection it holds (`first`: measured only on
    a fresh server, whose allocator has not held as many before), and what holding them costs its CPU
    while no beat arrives."""
    opening = asyncio.Semaphore(64)
    tally = Tally()

    async def one(node: SimNode) -> None:
        async with opening:
            await _send(client, node, time.perf_counter(), tally)

    before = _rss_kib(server_pid)
    await asyncio.gather(*(one(n) for n in nodes))
    await asyncio.sleep(2)
    after = _rss_kib(server_pid)
    cpu0 = tree_cpu_s(server_pid)
    await asyncio.sleep(3)
    idle_pct = 100 * (tree_cpu_s(server_pid) - cpu0) / 3
    held = client.open if isinstance(client, PerNodeClient) else 0
    per = (after - before) / max(1, held)
    memory = ""
    if first:
        figure(f"server memory per held connection ({held:,} held)", per, "KiB")
        memory = (
            f"; the server's memory {before / 1024:.0f} MiB before, {after / 1024:.0f} MiB holding them: "
            f"{per:.1f} KiB each, {per * GOAL_NODES / 1024:.0f} MiB for {GOAL_NODES:,} minions (the server "
            f"runs {SERVE_LOOP} and {SERVE_HTTP}: provisioner/api/tuning.py)"
        )
    return [
        f"  held: {held:,} connections open, one per node (errors {sum(tally.errors.values())}){memory}; "
        f"its CPU holding them with no beats: {idle_pct:.0f} % of one core",
    ]


def _report(
    args: argparse.Namespace,
    mode: str,
    tally: Tally,
    elapsed: float,
    cpu: list[float],
    asked: int,
    primed: int,
) -> list[str]:
    lat = tally.latencies_ms
    p50, p99 = (statistics.median(lat) if lat else float("nan")), _pct(lat, 0.99)
    qp50, qp99 = (
        (statistics.median(tally.quote_latencies_ms) if tally.quote_latencies_ms else float("nan")),
        _pct(tally.quote_latencies_ms, 0.99),
    )
    errors = sum(tally.errors.values())
    lines = [
        f"  warm-up: {primed} beats, {asked} answers asked for a quote",
        f"  heartbeat latency (from the scheduled send): p50 {p50:.1f} ms, p99 {p99:.1f} ms, "
        f"max {max(lat, default=float('nan')):.1f} ms over {len(lat)} beats",
        f"  beats carrying a quote: {tally.quotes} ({100 * tally.quotes / max(1, len(lat)):.1f} %), "
        f"p50 {qp50:.1f} ms, p99 {qp99:.1f} ms",
        f"  achieved {len(lat) / elapsed:.0f} beats/s answered (target {args.rate:.0f}/s), errors {errors}"
        + (f": {tally.errors.most_common(3)}" if errors else ""),
        f"  CPU over the run: server {100 * cpu[0] / elapsed:.0f} % of one core, PostgreSQL "
        f"{100 * cpu[1] / elapsed:.0f} %, load client {100 * cpu[2] / elapsed:.0f} %; server "
        f"{1000 * cpu[0] / max(1, len(lat)):.2f} ms CPU per beat",
        f"  p99 / {GOAL_P99_MS:.0f} ms goal = {p99 / GOAL_P99_MS:.2f} ({SOURCE_NOTE})",
        _budget(len(lat), cpu),
    ]
    how = _how_connected(args, mode)
    how += f", {args.workers} workers" if args.workers > 1 else ", one process pinned to one core"
    run = f"{args.nodes:,} nodes at {args.rate:.0f} beats/s, {how}"
    figure(f"heartbeats, {run}: p99", p99, "ms", target=GOAL_P99_MS)
    figure("the same: beats answered", len(lat) / elapsed, "/s", target=args.rate, bound="≥")
    figure("the same: server CPU per beat", 1000 * cpu[0] / max(1, len(lat)), "ms")
    return lines


def _how_connected(args: argparse.Namespace, mode: str) -> str:
    if mode == "kept":
        return "kept connections"
    if mode == "storm":
        return "a new TLS connection every beat, resumed"
    every = (
        f"every {args.reconnect_every} beats"
        if args.reconnect_every
        else f"after each connection's lifetime ({CONNECTION_LIFETIME_S:.0f} s ± "
        f"{100 * CONNECTION_LIFETIME_JITTER:.0f} %, as a minion)"
    )
    return f"a new TLS connection {every}, " + ("full handshakes" if mode == "full" else "resumed")


def _budget(answered: int, cpu: list[float]) -> str:
    """What the goal's rate leaves the server on this machine: the load client and PostgreSQL take their
    measured CPU per beat at that rate too, and the server has the rest of the cores."""
    client_ms, postgres_ms, server_ms = (1000 * c / max(1, answered) for c in (cpu[2], cpu[1], cpu[0]))
    rate = GOAL_NODES / HEARTBEAT_S
    others = (client_ms + postgres_ms) * rate / 1000  # cores
    left = (os.cpu_count() or 1) - others
    return (
        f"  budget at the goal's {rate:.0f} beats/s on {os.cpu_count()} cores: the load client "
        f"{client_ms:.2f} ms and PostgreSQL {postgres_ms:.2f} ms of CPU per beat take {others:.2f} cores, "
        f"leaving the server {max(0.0, 1000 * left / rate):.2f} ms per beat at 100 % busy "
        f"(it used {server_ms:.2f})"
    )


def main(argv: Sequence[str] | None = None) -> None:
    run(_arguments(options_from_argv(sys.argv[1:]) if argv is None else argv))


if __name__ == "__main__":
    main()
