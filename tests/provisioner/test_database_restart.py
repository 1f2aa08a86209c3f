"""PostgreSQL restarted under a fleet's beats (issue 43's failures): a `provision serve` on PostgreSQL, 24
minions beating every second through the minion's own client, and the database stopped at once
(`pg_ctl -m immediate`: every connection dies) and started again. Beats fail cleanly while it is away
(503, "the database is unreachable", never a 500 or a hang), every node is answered again within two
intervals of the database's return, and no node goes errored or leaves its state because of it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from bench.bench_fleet_heartbeats import seed
from tests.fixtures.control_plane import ControlPlane, start_control_plane
from tests.fixtures.fleet import Beats, fleet_beats
from tests.fixtures.postgres import PostgresCluster

BEAT_S = 1.0
NODES = 24


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[PostgresCluster, ControlPlane, str, list[tuple[str, str]]]]:
    with PostgresCluster() as cluster:  # its own: the session's cluster is not restarted under others
        url = cluster.create_database()
        nodes = [(n.node_id, n.credential) for n in seed(url, NODES, 1_000_000)]
        quiet = {"RIGBASE_QUOTE_EVERY": "10000019", "RIGBASE_HEARTBEAT_S": str(BEAT_S)}
        with start_control_plane(tmp_path / "home", url, seed_store=False, env=quiet) as cp:
            yield cluster, cp, url, nodes


def test_a_database_restart_under_load_fails_beats_cleanly_and_every_node_comes_back(
    served: tuple[PostgresCluster, ControlPlane, str, list[tuple[str, str]]],
) -> None:
    cluster, cp, url, nodes = served
    outcome: dict[str, list[Beats]] = {}
    fleet = threading.Thread(
        target=lambda: outcome.update(beats=fleet_beats(cp.url, cp.ca.read_text(), nodes, BEAT_S, 12.0))
    )
    fleet.start()
    time.sleep(4)
    down_at = time.time()
    cluster._run("pg_ctl", "-D", str(cluster.data), "-m", "immediate", "-w", "stop")
    time.sleep(2 * BEAT_S)  # two beats of every node meet no database
    cluster._start()
    up_at = time.time()
    fleet.join(60)
    beats = outcome["beats"]

    failures = [why for b in beats for why in b.why]
    assert failures, "no beat met the stopped database"
    assert all("HTTP 503" in why and "database" in why for why in failures), set(failures)
    for (node_id, _), seen in zip(nodes, beats, strict=True):
        assert all(down_at <= t <= up_at + 2 * BEAT_S for t in seen.failed), (node_id, seen)
        back = [t for t in seen.answered if t > up_at]
        assert back and back[0] - up_at < 2 * BEAT_S, (node_id, back[:1], seen.failed)
        assert seen.states == {"maintenance"}, (node_id, seen.states)

    engine = create_engine(url)
    try:
        with engine.connect() as db:
            states = dict(db.execute(text("SELECT state, count(*) FROM nodes GROUP BY state")).all())
    finally:
        engine.dispose()
    assert states == {"maintenance": NODES}, states
