"""Engines and sessions for the store: SQLite (default, a file under $RIGBASE_HOME) or PostgreSQL.

SQLite is tuned for a single control-plane process with a thread pool (WAL, busy timeout, foreign
keys on); PostgreSQL gets a pre-ping pool so a restarted database does not fail the first request."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from contracts.errors import InvalidInput, Unavailable


def make_engine(url: str, **kwargs: Any) -> Engine:
    """An engine for `url`; raises InvalidInput for a URL SQLAlchemy cannot parse or drive."""
    try:
        parsed = make_url(url)
    except Exception as exc:  # noqa: BLE001
        raise InvalidInput(
            f"database URL '{url}' is not valid: use sqlite:///PATH or postgresql://USER@HOST/DB"
        ) from exc
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() == "sqlite":
        engine = create_engine(parsed, connect_args={"check_same_thread": False, "timeout": 15}, **kwargs)

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        return engine
    if parsed.get_backend_name() != "postgresql":
        raise InvalidInput(
            f"database '{parsed.get_backend_name()}' is not supported: use SQLite or PostgreSQL"
        )
    kwargs.setdefault("pool_pre_ping", True)
    kwargs.setdefault("pool_size", 10)
    return create_engine(parsed, connect_args={"connect_timeout": 5}, **kwargs)


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
