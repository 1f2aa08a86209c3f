"""Which control-plane process runs the reconcilers: exactly one of all the processes on one store.

`provision serve --workers N`, or several hosts on one PostgreSQL database, start a reconciler loop in every
process; only the leader's passes run. On PostgreSQL the leader holds a session-level advisory lock on a
connection of its own: the database releases it when that connection ends, so a killed leader (SIGKILL, a
lost host) hands over within one RETRY_S to whichever process asks next — no lease to expire, no clock to
trust. On SQLite the same is a `flock` on a file beside the database, released by the kernel when the
process dies. A leader that loses its connection steps down before its next pass."""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from pathlib import Path
from typing import IO, Any

from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

log = logging.getLogger("rigbase.reconcilers.leader")

# pg advisory lock key: the first 8 bytes of sha256("rigbase reconcilers"), as a signed bigint
LOCK_KEY = int.from_bytes(bytes.fromhex("5b3d0f6f0e7a4c21"), "big", signed=True)
RETRY_S = 2.0


class Leadership:
    """`leading` is set while this process holds the lock; `wait()` blocks a pass until it does."""

    def __init__(self, engine: Engine, retry_s: float = RETRY_S) -> None:
        self.engine = engine
        self.retry_s = retry_s
        self.leading = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: Any = None
        self._file: IO[str] | None = None

    # -- lifecycle -------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="reconcile-leader", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self._release()

    def wait(self, timeout: float | None = None) -> bool:
        return self.leading.wait(timeout)

    # -- the loop --------------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self.leading.is_set():
                    self._check()
                elif self._acquire():
                    log.info("this process now runs the reconcilers (pid %d)", os.getpid())
                    self.leading.set()
            except Exception:
                log.warning("reconciler leadership lost or not acquirable; retrying", exc_info=True)
                self._release()
            self._stop.wait(self.retry_s)

    def _sqlite_lock_path(self) -> Path | None:
        url = make_url(self.engine.url)
        if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
            return None
        return Path(url.database).with_name(Path(url.database).name + ".reconcilers.lock")

    def _acquire(self) -> bool:
        if self.engine.dialect.name == "postgresql":
            conn = self.engine.connect()
            got = conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": LOCK_KEY}).scalar()
            conn.commit()  # keep no transaction open; the session-level lock stays with the connection
            if got:
                self._conn = conn
                return True
            conn.close()
            return False
        path = self._sqlite_lock_path()
        if path is None:
            return True  # an in-memory store belongs to this process alone
        fh = open(path, "a")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            return False
        self._file = fh
        return True

    def _check(self) -> None:
        if self._conn is not None:
            self._conn.execute(text("SELECT 1"))
            self._conn.commit()

    def _release(self) -> None:
        self.leading.clear()
        if self._conn is not None:
            try:
                # ends the session, and the database releases the advisory lock. invalidate(), not close()
                # alone: the connection is the app pool's, and close() would hand it back to the pool with
                # its session, and the lock, alive (tests/provisioner/test_leader.py)
                self._conn.invalidate()
                self._conn.close()
            except Exception:
                pass
            self._conn = None
        if self._file is not None:
            self._file.close()
            self._file = None
