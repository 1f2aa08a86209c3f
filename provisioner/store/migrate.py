"""Alembic migrations, run at server start (and by tests) from the revisions packaged in
provisioner/store/migrations/. A database whose schema is newer than this code is refused: running
old code against a newer schema could silently lose data the newer code relies on."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

from contracts.errors import Unavailable
from provisioner.store.engine import check_reachable, make_engine

MIGRATIONS = Path(__file__).parent / "migrations"


def alembic_config(url: str) -> Config:
    cfg = Config(str(MIGRATIONS / "alembic.ini"))
    cfg.set_main_option("script_location", str(MIGRATIONS))
    # '%' is ConfigParser's interpolation character; URLs may contain it (encoded passwords)
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def current_revisions(engine: Engine) -> set[str]:
    with engine.connect() as conn:
        return set(MigrationContext.configure(conn).get_current_heads())


def upgrade(url: str, engine: Engine | None = None) -> None:
    """Bring the store to the newest schema this code knows; refuse a newer or unreachable one."""
    owned = engine is None
    engine = engine or make_engine(url)
    try:
        check_reachable(engine)
        cfg = alembic_config(url)
        script = ScriptDirectory.from_config(cfg)
        known = {rev.revision for rev in script.walk_revisions()}
        unknown = current_revisions(engine) - known
        if unknown:
            raise Unavailable(
                f"the database is at schema revision {', '.join(sorted(unknown))}, newer than this rigbase "
                f"(newest known: {', '.join(script.get_heads())}): upgrade rigbase before starting it",
                code="schema_too_new",
            )
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "heads")
    finally:
        if owned:
            engine.dispose()
