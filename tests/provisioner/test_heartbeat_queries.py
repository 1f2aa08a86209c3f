"""What one heartbeat asks the store. 10,000 nodes beat ≈ 333 times a second, so
each beat must ask a question once: the credential's node comes with its region and provider in ONE query,
and the reservations assigned to the node are read once for both the reporter (what the node says it
serves) and the contributor (what it must serve). Counts statements, not time, on both stores; the nodes
are written into the store as joined (bench/bench_fleet_heartbeats.py `seed`), and the beat goes through
the real heartbeat service."""

from __future__ import annotations

import base64
import json
import re
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.orm.attributes import set_committed_value

import provisioner.api.app  # noqa: F401  (every desired-state contributor the server registers)
from bench.bench_fleet_heartbeats import ACTUAL, SimNode, seed
from contracts.errors import Conflict
from contracts.heartbeat import parse_desired
from contracts.heartbeat_keys import HeartbeatKey
from contracts.messages import HeartbeatRequest, HeartbeatResponse
from minion.join.run import HeldDesired
from provisioner.services import beat
from provisioner.services.common.heartbeat_timing import HeartbeatTiming
from provisioner.services.common.runtime import Runtime, attach
from provisioner.services.fleet import nodes, nonce_store
from provisioner.services.regions import reservations
from provisioner.settings import Settings
from provisioner.store.engine import make_engine, make_sessionmaker
from provisioner.store.models import Node

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


def _beat(
    sessions: Any,
    node: SimNode,
    actual: dict[str, Any],
    revision: str | None = None,
    *,
    quote: dict[str, Any] | None = None,
    timing: HeartbeatTiming = TIMING,
) -> dict[str, Any]:
    body = HeartbeatRequest.model_validate(
        {"version": 1, "actual": actual, "desired_revision": revision, "quote": quote}
    )
    with sessions.begin() as s:
        answer = beat.beat(
            s, node.node_id, node.credential, body, observed_address="127.0.0.1", timing=timing
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
    # every key of the contract, in the order the control plane lists them, each its key's model
    assert list(parse_desired(answer["desired"])) == list(beat.CONTRIBUTORS) and len(
        beat.CONTRIBUTORS
    ) == len(HeartbeatKey)
    with sessions.begin() as s:
        rsv = reservations.get(s, "web", "fleet")
        assert (rsv.actual_state, rsv.address) == ("published", "192.0.2.7")


def test_an_unchanged_desired_state_is_not_sent_again_and_a_change_is_sent_whole(fleet: Any) -> None:
    """The minion echoes the answer's revision; while the desired state is the same, the answer leaves it
    out. A change (here: the reservation's port) gets the whole state under a new revision, and a beat
    naming an old or unknown revision gets it whole too. The minion's side (HeldDesired, as its heartbeat
    loop keeps it) applies the state it holds for an answer that leaves it out."""
    sessions, _engine, node = fleet
    held = HeldDesired()
    first = _beat(sessions, node, ACTUAL, held.revision)
    revision = first["desired_revision"]
    assert first["desired"]["reservations"] and len(revision) == 32
    assert held.take(HeartbeatResponse.model_validate(first)) == first["desired"]
    again = _beat(sessions, node, ACTUAL, held.revision)
    assert again["desired"] is None and again["desired_revision"] == revision
    assert held.take(HeartbeatResponse.model_validate(again)) == first["desired"]
    assert HeldDesired().take(HeartbeatResponse.model_validate(again)) is None  # holds none: nothing to apply
    assert len(json.dumps(again)) < len(json.dumps(first)) / 2
    with sessions.begin() as s:
        reservations.remove(s, "web", region="fleet", actor="test")
    changed = _beat(sessions, node, ACTUAL, held.revision)
    assert changed["desired"]["reservations"] == [] and changed["desired_revision"] != revision
    assert held.take(HeartbeatResponse.model_validate(changed)) == changed["desired"]
    assert held.revision == changed["desired_revision"]
    assert _beat(sessions, node, ACTUAL, "0" * 32)["desired"] == changed["desired"]
    assert _beat(sessions, node, ACTUAL, changed["desired_revision"])["desired"] is None


def _row(sessions: Any, node: SimNode) -> tuple[Any, ...]:
    with sessions.begin() as s:
        found = s.get(Node, node.node_id)
        return found.heartbeats, found.version, found.last_heartbeat_at, found.inventory


def test_a_steady_beat_writes_only_its_node_row_once(fleet: Any) -> None:
    """The report, the beat's count (which the quote schedule reads) and the observed address: one UPDATE
    of the node's row, nothing written to its attestation row (revision 0025 moved the count)."""
    sessions, engine, node = fleet
    _beat(sessions, node, ACTUAL)
    before = _row(sessions, node)
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda _c, _cur, sql, *_: statements.append(sql))
    _beat(sessions, node, ACTUAL)
    writes = Counter(
        " ".join(s.split()[:2]) for s in statements if s.lstrip().upper().startswith(("UPDATE", "INSERT"))
    )
    assert writes == {"UPDATE nodes": 1}, statements
    heartbeats, version, beat_at, inventory = _row(sessions, node)
    assert (heartbeats, version) == (before[0] + 1, before[1] + 1)
    assert beat_at > before[2] and inventory == before[3]


def test_a_beat_carrying_a_quote_reads_the_manifests_once_and_spends_its_nonce_in_one_statement(
    fleet: Any,
) -> None:
    """The quote check asks for the region's PCR policy and its boot path, both from its registered
    manifests: one read. The nonce is spent by one UPDATE that returns its record."""
    sessions, engine, node = fleet
    asked = _beat(sessions, node, ACTUAL, timing=HeartbeatTiming(quote_every=1))
    nonce = base64.b64decode(asked["quote_nonce"])
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda _c, _cur, sql, *_: statements.append(sql))
    answer = _beat(sessions, node, ACTUAL, quote=node.ak.quote(nonce, node.pcrs))
    assert (answer["state"], answer["reason"], answer["quote_nonce"]) == ("maintenance", None, None)
    assert _reads(statements)["image_manifests"] == 1, statements
    spent = [s for s in statements if "attestation_nonces" in s]
    assert len(spent) == 1 and "RETURNING" in spent[0].upper(), spent
    # spent: the one statement matches nothing, and a read tells a spent nonce from an unknown one
    with sessions.begin() as s:
        store = nonce_store.DbNonceStore(s)
        replayed = store.consume(nonce)
        assert replayed is not None and replayed.used and replayed.subject == f"node:{node.node_id}"
        assert store.consume(b"never issued") is None


def test_a_beat_moving_to_a_new_address_stores_it_in_the_same_write(fleet: Any) -> None:
    sessions, engine, node = fleet
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda _c, _cur, sql, *_: statements.append(sql))
    body = HeartbeatRequest.model_validate({"version": 1, "actual": ACTUAL})
    with sessions.begin() as s:
        beat.beat(s, node.node_id, node.credential, body, observed_address="192.0.2.9", timing=TIMING)
    assert sum(s.lstrip().upper().startswith("UPDATE") for s in statements) == 1, statements
    assert _row(sessions, node)[3]["observed_address"] == "192.0.2.9"


def test_a_beat_on_a_node_row_changed_meanwhile_is_a_conflict_and_writes_nothing(fleet: Any) -> None:
    """The beat's write checks the row's version as the ORM's does: a node read before another request
    changed it (here: loaded with the version before) is refused, not overwritten."""
    sessions, _engine, node = fleet
    before = _row(sessions, node)
    with pytest.raises(Conflict, match="changed by another request at the same time"), sessions.begin() as s:
        stale = s.get(Node, node.node_id)
        set_committed_value(stale, "version", stale.version - 1)
        nodes.record_beat(s, stale, at=datetime.now(UTC))
    assert _row(sessions, node) == before


def test_a_beat_of_a_node_with_nothing_to_serve_or_run_reads_only_its_node(fleet: Any) -> None:
    """Most of a fleet serves no reservation and runs no job: the beat's first query says so (an EXISTS
    for each of the beat's reads, services/beat.py SKIPPABLE_READS) and those reads are not made."""
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


def test_migration_moves_each_nodes_beat_count_and_back(database_url: str) -> None:
    """0025 moves the beat count from node_attestations onto nodes (the quote schedule goes on from where
    it was) and back down again, on both stores."""
    import sqlalchemy as sa
    from alembic import command

    from provisioner.store.migrate import alembic_config

    (node,) = seed(database_url, 1, 1_000_000)
    engine = make_engine(database_url)
    cfg = alembic_config(database_url)

    def migrate(step: Any, target: str) -> None:
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            step(cfg, target)

    def count(table: str, key: str) -> int:
        with engine.connect() as conn:
            query = sa.text(f"SELECT heartbeats FROM {table} WHERE {key} = :id")
            return int(conn.execute(query, {"id": node.node_id}).scalar_one())

    migrate(command.downgrade, "0024_gcp_permanent_compute")
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE node_attestations SET heartbeats = 41 WHERE node_id = :id"), {"id": node.node_id}
        )
    migrate(command.upgrade, "0025_beat_count_on_node")
    assert count("nodes", "id") == 41
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE nodes SET heartbeats = 42 WHERE id = :id"), {"id": node.node_id})
    migrate(command.downgrade, "0024_gcp_permanent_compute")
    assert count("node_attestations", "node_id") == 42
    migrate(command.upgrade, "head")
    engine.dispose()
