"""PostgreSQL's pool across a database restart (provisioner/store/engine.py): a connection idle for
PING_AFTER_IDLE_S is pinged before use, so the first request after a restart gets a new connection instead
of failing; a connection in use a moment ago is handed out without the ping's round trip. Against a real
PostgreSQL server, stopped with `-m immediate` (every client connection dies) and started again."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from provisioner.store import engine as store_engine
from provisioner.store.engine import make_engine
from tests.fixtures.postgres import PostgresCluster

IDLE_S = 0.3  # the test's ping threshold, instead of the server's seconds


@pytest.fixture()
def restartable() -> Iterator[tuple[PostgresCluster, Engine]]:
    with PostgresCluster() as cluster:
        engine = make_engine(cluster.create_database(), pool_size=1, max_overflow=0)
        yield cluster, engine
        engine.dispose()


def _backend_pid(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())


def test_the_first_request_after_a_restart_gets_a_new_connection(
    restartable: tuple[PostgresCluster, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster, engine = restartable
    monkeypatch.setattr(store_engine, "PING_AFTER_IDLE_S", IDLE_S)
    before = _backend_pid(engine)
    cluster.restart()
    time.sleep(IDLE_S + 0.1)
    after = _backend_pid(engine)  # no error: the dead connection was pinged and replaced
    assert after != before


def test_a_connection_in_use_a_moment_ago_is_not_pinged(
    restartable: tuple[PostgresCluster, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under load every connection is reused within milliseconds: no ping (it was one round trip of a
    steady heartbeat's five). Shown by what that costs: a restart between two quick uses reaches the
    request, which fails once; SQLAlchemy then replaces the pool's connections and the next one works."""
    cluster, engine = restartable
    monkeypatch.setattr(store_engine, "PING_AFTER_IDLE_S", 60.0)
    before = _backend_pid(engine)
    cluster.restart()
    with pytest.raises(DBAPIError) as failed:
        _backend_pid(engine)
    assert failed.value.connection_invalidated
    assert _backend_pid(engine) != before
