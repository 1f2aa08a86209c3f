"""Two workers racing the same transition on one PostgreSQL database: exactly one wins, the other
gets a one-line refusal, and the audit trail holds exactly one event for it."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select

from contracts.errors import Conflict, RuleViolation
from provisioner.domain.states import NodeState
from provisioner.services.fleet import nodes
from provisioner.services.regions import providers, regions
from provisioner.store.engine import make_engine, make_sessionmaker
from provisioner.store.migrate import upgrade
from provisioner.store.models import AuditEvent
from tests.fixtures.control_plane import start_control_plane
from tests.fixtures.postgres import PostgresCluster

ROUNDS = 12
ACTOR = "operator:test"


def _prepare(url: str) -> None:
    """A region with ROUNDS nodes in maintenance, ready to be activated."""
    engine = make_engine(url)
    upgrade(url, engine)
    with make_sessionmaker(engine).begin() as s:
        providers.enable(s, "physical", {}, actor=ACTOR)
        regions.create(s, "race", provider="physical", actor=ACTOR)
        for i in range(ROUNDS):
            node = nodes.add(s, f"n{i}", region="race", minion_id=f"{i + 1:032x}", actor=ACTOR)
            for state in (NodeState.ENROLLING, NodeState.PROVISIONING, NodeState.MAINTENANCE):
                nodes.transition(s, node, state, actor=ACTOR)
    engine.dispose()


def _activations(url: str) -> dict[str, int]:
    engine = make_engine(url)
    with engine.connect() as conn:
        rows = conn.execute(
            select(AuditEvent.resource_name, func.count())
            .where(AuditEvent.to_state == "active")
            .group_by(AuditEvent.resource_name)
        ).all()
    engine.dispose()
    return dict(rows)


@pytest.fixture
def race_db(postgres_cluster: PostgresCluster) -> str:
    url = postgres_cluster.create_database()
    _prepare(url)
    return url


def test_two_engines_race_the_same_transition(race_db: str) -> None:
    engines = [make_engine(race_db), make_engine(race_db)]
    factories = [make_sessionmaker(e) for e in engines]

    def attempt(worker: int, name: str, barrier: threading.Barrier) -> str:
        with factories[worker]() as s:
            node = nodes.get(s, name)  # both read `maintenance` before either writes
            barrier.wait()
            try:
                nodes.transition(s, node, NodeState.ACTIVE, actor=f"operator:w{worker}")
                s.commit()
                return "won"
            except (RuleViolation, Conflict) as exc:
                s.rollback()
                assert "\n" not in exc.message
                return "lost"

    with ThreadPoolExecutor(2) as pool:
        for i in range(ROUNDS):
            barrier = threading.Barrier(2)
            outcomes = sorted(pool.map(partial(attempt, name=f"n{i}", barrier=barrier), [0, 1]))
            assert outcomes == ["lost", "won"], f"round {i}: {outcomes}"
    for e in engines:
        e.dispose()
    assert _activations(race_db) == {f"n{i}": 1 for i in range(ROUNDS)}


def test_two_server_processes_race_the_same_request(race_db: str, tmp_path: Path) -> None:
    with start_control_plane(tmp_path / "a", race_db) as a, start_control_plane(tmp_path / "b", race_db) as b:
        servers = [a.url, b.url]
        # the second server shares the first one's database, hence its admin token
        headers = {"Authorization": f"Bearer {a.token}"}

        def call(url: str, name: str, barrier: threading.Barrier) -> httpx.Response:
            with httpx.Client(base_url=url, headers=headers, timeout=30) as c:
                barrier.wait()
                return c.post(f"/v1/nodes/{name}/maintenance", json={"mode": "off"})

        with ThreadPoolExecutor(2) as pool:
            for i in range(ROUNDS):
                barrier = threading.Barrier(2)
                responses = list(pool.map(partial(call, name=f"n{i}", barrier=barrier), servers))
                # `maintenance off` is idempotent: the loser either sees the node already active (200,
                # no second transition) or lost the row version race (409 concurrent_update)
                codes = sorted(r.status_code for r in responses)
                assert codes in ([200, 200], [200, 409]), f"round {i}: {[r.text for r in responses]}"
                for r in responses:
                    assert r.status_code == 200 or r.json()["code"] == "concurrent_update", r.text
                    assert r.status_code != 200 or r.json()["state"] == "active", r.text
    assert _activations(race_db) == {f"n{i}": 1 for i in range(ROUNDS)}
