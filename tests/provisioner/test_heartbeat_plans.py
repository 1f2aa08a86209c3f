"""The beat's queries at 10,000 nodes on PostgreSQL, as the planner runs them: every statement one steady
beat sends (a node serving a reservation, so the skippable reads are made too) is EXPLAINed with its own
parameters after ANALYZE: none reads a table of more than a thousand rows by a sequential scan, and with
sequential scans disabled every table it reads has an index its query can use (the tables still small
here grow with the fleet's history). An index the beat needs that a migration drops, or a query that
stops using one, fails here."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event, text

import provisioner.api.app  # noqa: F401  (every desired-state contributor the server registers)
from bench.bench_fleet_heartbeats import ACTUAL, seed
from contracts.messages import HeartbeatRequest
from provisioner.services import beat
from provisioner.services.common.heartbeat_timing import HeartbeatTiming
from provisioner.services.common.runtime import Runtime, attach
from provisioner.services.regions import reservations
from provisioner.settings import Settings
from provisioner.store.engine import make_engine, make_sessionmaker

NODES = 10_000
LARGE = 1_000  # rows: a table this big is read through an index
TIMING = HeartbeatTiming(quote_every=1_000_003)


def _scans(plan: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(node type, relation) of every scan in a plan tree."""
    if "Relation Name" in plan:
        yield plan["Node Type"], plan["Relation Name"]
    for child in plan.get("Plans", []):
        yield from _scans(child)


@pytest.fixture(scope="module")
def fleet(postgres_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any, Any]]:
    url = postgres_cluster.create_database()
    nodes = seed(url, NODES, 1_000_000)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RIGBASE_HOME", str(tmp_path_factory.mktemp("plans") / "home"))
        engine = make_engine(url)
        sessions = attach(make_sessionmaker(engine), Runtime.from_settings(Settings.load()))
    serving = nodes[NODES // 2]
    with sessions.begin() as s:
        reservations.add(s, "web", region="fleet", hostname="web", port=8080, actor="test")
        reservations.assign(s, "web", node=serving.node_id, actor="test")
    with engine.connect() as db:
        db.execute(text("COMMIT"))
        db.execute(text("ANALYZE"))
    yield engine, sessions, serving
    engine.dispose()


def test_no_query_of_a_steady_beat_scans_a_large_table(fleet: tuple[Any, Any, Any]) -> None:
    engine, sessions, node = fleet
    body = HeartbeatRequest.model_validate({"version": 1, "actual": ACTUAL})
    sent: list[tuple[str, Any]] = []

    def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        sent.append((statement, parameters))

    for _ in range(2):  # the first beat after the seed, then a steady one
        sent.clear()
        event.listen(engine, "before_cursor_execute", record)
        with sessions.begin() as s:
            beat.beat(s, node.node_id, node.credential, body, observed_address="127.0.0.1", timing=TIMING)
        event.remove(engine, "before_cursor_execute", record)
    assert sent, "the beat sent no SQL"

    with engine.connect() as db:
        sizes = {
            name: rows
            for name, rows in db.execute(
                text(
                    "SELECT relname, reltuples FROM pg_class "
                    "WHERE relkind = 'r' AND relnamespace = 'public'::regnamespace"
                )
            ).all()
        }
        assert sizes["nodes"] >= NODES * 0.9, sizes  # ANALYZE saw the fleet
        queries = [
            (statement, parameters)
            for statement, parameters in sent
            if statement.lstrip().upper().startswith(("SELECT", "UPDATE", "INSERT", "DELETE"))
        ]
        assert len(queries) >= 3  # the node's read, its update and the reservations at least
        for statement, parameters in queries:
            (plan,) = db.exec_driver_sql("EXPLAIN (FORMAT JSON) " + statement, parameters).scalar_one()
            for kind, relation in _scans(plan["Plan"]):
                assert not (kind == "Seq Scan" and sizes.get(relation, 0) > LARGE), (
                    f"a sequential scan of {relation} ({sizes[relation]:.0f} rows): {statement}"
                )
        # the tables that are small here (workers, reservations, jobs) grow with the fleet's history:
        # told to avoid sequential scans, the planner finds an index for every table the beat reads
        db.exec_driver_sql("SET enable_seqscan = off")
        for statement, parameters in queries:
            (plan,) = db.exec_driver_sql("EXPLAIN (FORMAT JSON) " + statement, parameters).scalar_one()
            unindexed = [relation for kind, relation in _scans(plan["Plan"]) if kind == "Seq Scan"]
            assert not unindexed, f"no index serves {unindexed}: {statement}"
