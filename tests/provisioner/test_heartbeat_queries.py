"""Issue 17 ("Fleet scale"): what one heartbeat asks the store. 10,000 nodes beat ≈ 333 times a second, so
each beat must ask a question once: the credential's node comes with its region and provider in ONE query,
and the reservations assigned to the node are read once for both the reporter (what the node says it
serves) and the contributor (what it must serve). Counts statements, not time, on both stores; the nodes
are written into the store as joined (bench/bench_fleet_heartbeats.py `seed`), and the beat goes through
the real heartbeat service."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import pytest
from sqlalchemy import event

import provisioner.api.app  # noqa: F401  (every desired-state contributor the server registers)
from bench.bench_fleet_heartbeats import ACTUAL, SimNode, seed
from contracts.messages import HeartbeatRequest
from provisioner.services import heartbeat, reservations
from provisioner.services.heartbeat_timing import HeartbeatTiming
from provisioner.services.runtime import Runtime, attach
from provisioner.settings import Settings
from provisioner.store.engine import make_engine, make_sessionmaker

# no quote asked for while the test beats (the first beat after the seed would otherwise ask for one)
TIMING = HeartbeatTiming(quote_every=1_000_003)  # the seeded beat counts never reach a multiple
SERVING = {"name": "web", "state": "published", "address": "192.0.2.7", "mdns": True, "upnp": None}


def _outside_parentheses(sql: str) -> str:
    """The statement without what its parentheses hold (subqueries such as the first query's EXISTS)."""
    kept, depth = [], 0
    for ch in sql:
        depth += ch == "("
        if depth == 0:
            kept.append(ch)
        depth -= ch == ")" and depth > 0
    return "".join(kept)


def _reads(statements: list[str]) -> Counter[str]:
    """SELECTs by the table after their first FROM outside parentheses."""
    selects = (_outside_parentheses(s) for s in statements if s.lstrip().upper().startswith("SELECT"))
    tables = (re.search(r"\bFROM (\w+)", s) for s in selects)
    return Counter(m.group(1) for m in tables if m is not None)


@pytest.fixture()
def fleet(database_url: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("RIGBASE_HOME", str(tmp_path / "home"))
    (node,) = seed(database_url, 1, 1_000_000)
    engine = make_engine(database_url)
    sessions = attach(make_sessionmaker(engine), Runtime.from_settings(Settings.load()))
    with sessions.begin() as s:
        reservations.add(s, "web", region="fleet", hostname="web", port=8080, actor="test")
        reservations.assign(s, "web", node=node.node_id, actor="test")
    yield sessions, engine, node
    engine.dispose()


def _beat(sessions: Any, node: SimNode, actual: dict[str, Any]) -> dict[str, Any]:
    body = HeartbeatRequest.model_validate({"version": 1, "actual": actual})
    with sessions.begin() as s:
        answer = heartbeat.beat(
            s, node.node_id, node.credential, body, observed_address="127.0.0.1", timing=TIMING
        )
    return answer.model_dump(mode="json")


def test_a_beat_reads_its_node_and_its_reservations_once(fleet: Any) -> None:
    sessions, engine, node = fleet
    _beat(sessions, node, ACTUAL)  # the first beat after the seed (and warm caches)
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda _c, _cur, sql, *_: statements.append(sql))
    answer = _beat(sessions, node, {**ACTUAL, "reservations": [SERVING]})
    reads = _reads(statements)
    assert reads["node_attestations"] == 1, statements  # the node (region, provider) joined in
    assert reads["nodes"] == 0, statements
    assert reads["regions"] == reads["providers"] == 0, statements
    assert reads["reservations"] == 1, statements
    # no worker is placed on the node: the first query said so, and the workers are not read (twice: the
    # jobs reporter and the jobs contributor each asked for them)
    assert reads["job_workers"] == 0, statements
    # the reservations' and workers' node and region are the beating node's own, already loaded: not
    # joined again (their `lazy="joined"` relationships made these the beat's dearest reads)
    for sql in statements:
        head = _outside_parentheses(sql).split("WHERE")[0]
        if re.search(r"\bFROM (reservations|job_workers)\b", head):
            assert " JOIN " not in head, sql
    # and still what it was before the reads were shared: the report stored, the assignment answered
    assert answer["desired"]["reservations"] == [
        {"name": "web", "hostname": "web", "port": 8080, "protocol": "tcp", "expose_wan": False}
    ]
    with sessions.begin() as s:
        rsv = reservations.get(s, "web", "fleet")
        assert (rsv.actual_state, rsv.address) == ("published", "192.0.2.7")


def test_a_beat_writes_the_node_and_its_attestation_once_each(fleet: Any) -> None:
    sessions, engine, node = fleet
    _beat(sessions, node, ACTUAL)
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda _c, _cur, sql, *_: statements.append(sql))
    _beat(sessions, node, ACTUAL)
    updates = Counter(s.split()[1] for s in statements if s.lstrip().upper().startswith("UPDATE"))
    assert updates == {"nodes": 1, "node_attestations": 1}, statements


def test_a_beat_of_a_node_with_nothing_to_serve_or_run_reads_only_its_node(fleet: Any) -> None:
    """Most of a fleet serves no reservation and runs no job: the beat's first query says so (an EXISTS
    for each of the beat's reads, desired_state.SKIPPABLE_READS) and those reads are not made."""
    sessions, engine, node = fleet
    with sessions.begin() as s:
        reservations.unassign(s, "web", region="fleet", actor="test")
    _beat(sessions, node, ACTUAL)
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda _c, _cur, sql, *_: statements.append(sql))
    answer = _beat(sessions, node, ACTUAL)
    assert _reads(statements) == {"node_attestations": 1}, statements
    assert answer["desired"]["reservations"] == []
    assert answer["desired"]["jobs"]["workers"] == []
    # and the next beat after an assignment serves it: the question is asked on every beat
    with sessions.begin() as s:
        reservations.assign(s, "web", node=node.node_id, actor="test")
    statements.clear()
    answer = _beat(sessions, node, ACTUAL)
    assert [r["name"] for r in answer["desired"]["reservations"]] == ["web"]
    assert _reads(statements) == {"node_attestations": 1, "reservations": 1}, statements
