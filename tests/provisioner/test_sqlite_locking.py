"""SQLite takes its write lock where a unit of work begins (BEGIN IMMEDIATE, provisioner/store/engine.py),
so concurrent writers wait for each other instead of failing with "database is locked": within one
engine, and across two real `provision serve` processes on one SQLite file."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sqlalchemy import text

from provisioner.store.engine import make_engine
from tests.fixtures.control_plane import start_control_plane

WRITERS = 8
WRITES_EACH = 25


def test_a_reader_that_later_writes_waits_instead_of_failing(tmp_path: Path) -> None:
    """The case a deferred transaction loses: it reads, another writer commits, then it writes. SQLite
    cannot let a stale reader write and fails it at once; an immediate transaction waited up front."""
    engine = make_engine(f"sqlite:///{tmp_path / 'store.db'}")
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE counter (n INTEGER)")
        conn.exec_driver_sql("INSERT INTO counter VALUES (0)")
    started, errors = threading.Barrier(WRITERS), []

    def read_then_write() -> None:
        started.wait()
        try:
            for _ in range(WRITES_EACH):
                with engine.begin() as conn:
                    n = conn.execute(text("SELECT n FROM counter")).scalar_one()
                    conn.execute(text("UPDATE counter SET n = :n"), {"n": n + 1})
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=read_then_write) for _ in range(WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with engine.connect() as conn:
        # no lost update either: every read-modify-write saw the previous one's result
        assert conn.execute(text("SELECT n FROM counter")).scalar_one() == WRITERS * WRITES_EACH
    engine.dispose()


def test_two_servers_on_one_sqlite_file_take_concurrent_writes(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'shared.db'}"
    with (
        start_control_plane(tmp_path / "a", db) as a,
        start_control_plane(tmp_path / "b", db, token=a.token) as b,
    ):
        with a.client() as ca:
            assert ca.post("/v1/providers", json={"kind": "physical", "config": {}}).status_code == 201

        def writes(worker: int) -> list[int]:
            server = (a, b)[worker % 2]
            codes = []
            with server.client() as c:
                for i in range(WRITES_EACH):
                    name = f"r{worker}-{i}"
                    codes.append(
                        c.post("/v1/regions", json={"name": name, "provider": "physical"}).status_code
                    )
                    codes.append(c.post(f"/v1/regions/{name}/join-tokens", json={"ttl": "1h"}).status_code)
            return codes

        with ThreadPoolExecutor(WRITERS) as pool:
            codes = [code for batch in pool.map(writes, range(WRITERS)) for code in batch]
        assert codes.count(201) == len(codes), sorted(set(codes))
        with b.client() as cb:
            regions = cb.get("/v1/regions").json()["items"]
        assert len(regions) == WRITERS * WRITES_EACH
        for server in (a, b):
            log = (server.home / "server.log").read_text()
            assert "database is locked" not in log, log[-2000:]
