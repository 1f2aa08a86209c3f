"""Engines and sessions for the store: SQLite (default, a file under $RIGBASE_HOME) or PostgreSQL.

SQLite (WAL, foreign keys on) takes its write lock where a unit of work begins: every transaction is
`BEGIN IMMEDIATE`, which waits up to the busy timeout for the one writer's lock. A deferred transaction
would start as a reader and fail at once with "database is locked" when it later writes after another
writer committed in between (SQLite cannot wait there: the reader's snapshot is stale), which a join
burst beside operator writes, or two `provision serve` processes on one file, trigger. Reads in WAL mode
never wait for the writer.

PostgreSQL's pool pings a connection that sat idle for PING_AFTER_IDLE_S before handing it out, so a
restarted database does not fail the first request after it (a dead connection is replaced, not used). It
does not ping a connection that was in use a moment ago: under a fleet's heartbeats every connection is
reused within milliseconds, and a ping per checkout was one of a steady beat's five round trips. A database
that dies and comes back within that window fails the one request that meets a
dead connection; SQLAlchemy then replaces every connection of the pool."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError, OperationalError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import QueuePool

from contracts.errors import InvalidInput, Unavailable


def _private_sqlite_file(database: str | None) -> None:
    """The store holds token hashes and sealed secrets: its file is the owner's only. SQLite creates a
    new file with the process umask (0644) and gives its -wal/-shm the database file's mode, so the file
    is created 0600 here before SQLite opens it, and an existing one (with its -wal/-shm) is tightened."""
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    path = Path(database)
    if not path.parent.is_dir():
        return  # SQLite reports the missing directory itself
    try:  # an empty file is a new, empty SQLite database
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass
    for file in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        try:
            if file.stat().st_mode & 0o077:
                file.chmod(0o600)
        except FileNotFoundError:
            pass


# How long a unit of work waits for SQLite's write lock before it fails with "database is locked".
SQLITE_BUSY_TIMEOUT_S = 30.0


def make_engine(url: str, **kwargs: Any) -> Engine:
    """An engine for `url`; raises InvalidInput for a URL SQLAlchemy cannot parse or drive."""
    try:
        parsed = make_url(url)
    except Exception as exc:
        raise InvalidInput(
            f"database URL '{url}' is not valid: use sqlite:///PATH or postgresql://USER@HOST/DB"
        ) from exc
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() == "sqlite":
        _private_sqlite_file(parsed.database)
        engine = create_engine(
            parsed, connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_S}, **kwargs
        )

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            # The driver must not open transactions by itself: the "begin" hook below does, immediately.
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin_immediate(conn: Any) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    if parsed.get_backend_name() != "postgresql":
        raise InvalidInput(
            f"database '{parsed.get_backend_name()}' is not supported: use SQLite or PostgreSQL"
        )
    kwargs.setdefault("pool_size", 10)
    engine = create_engine(parsed, connect_args={"connect_timeout": 5}, **kwargs)
    _ping_when_idle(engine)
    return engine


# A pooled PostgreSQL connection idle at least this long is pinged before use (see the module docstring).
PING_AFTER_IDLE_S = 2.0
_IDLE_SINCE = "rigbase.idle_since"  # in the connection record's info: when the connection was checked in


def _ping_when_idle(engine: Engine) -> None:
    """SQLAlchemy's pessimistic disconnect handling (a checkout hook that raises DisconnectionError makes
    the pool drop the connection and try a new one), for idle connections only."""

    @event.listens_for(engine, "checkin")
    def _checked_in(_dbapi_conn: Any, record: Any) -> None:
        record.info[_IDLE_SINCE] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checked_out(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        idle_since = record.info.get(_IDLE_SINCE)
        if idle_since is None or time.monotonic() - idle_since < PING_AFTER_IDLE_S:
            return  # a new connection, or one in use a moment ago
        try:
            engine.dialect.do_ping(dbapi_conn)
        except engine.dialect.loaded_dbapi.Error as exc:
            raise DisconnectionError(f"an idle pooled connection is dead: {exc}") from exc


def pool_capacity(engine: Engine) -> int | None:
    """How many connections `engine` hands out at once (pool size plus overflow), or None when it has no
    bound (a pool with unlimited overflow, or one that opens a connection per checkout)."""
    pool = engine.pool
    if isinstance(pool, QueuePool):  # SQLite files and PostgreSQL; QueuePool has no public overflow bound
        overflow: int = pool._max_overflow
        return None if overflow < 0 else pool.size() + overflow
    return None


def check_reachable(engine: Engine) -> None:
    """One-line Unavailable when the database cannot be reached (wrong host, down, bad credentials)."""
    try:
        with engine.connect():
            pass
    except OperationalError as exc:
        detail = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc).splitlines()[0]
        raise Unavailable(
            f"cannot reach the database at {engine.url.render_as_string(hide_password=True)} "
            f"({detail}): start it or fix --database / RIGBASE_DATABASE_URL"
        ) from exc


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    # expire_on_commit=False: API handlers serialise objects after the unit of work commits
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    """One unit of work: commit on success, roll back on any exception."""
    with factory.begin() as session:
        yield session
