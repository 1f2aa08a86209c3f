"""Where rigbase keeps its state. Everything lives under $RIGBASE_HOME (default
~/.local/share/rigbase) so that a lab, a test or a second control plane is isolated by one variable."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_PORT = 8470


def rigbase_home() -> Path:
    """The state directory, created 0700 on first use (it holds keys and tokens)."""
    home = Path(os.environ.get("RIGBASE_HOME") or Path.home() / ".local" / "share" / "rigbase")
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    return home


def database_url() -> str:
    """RIGBASE_DATABASE_URL when set, else SQLite under the home. The plain libpq form
    (postgresql://…) is fine: store.engine.make_engine picks the psycopg driver for every URL,
    --database included."""
    return os.environ.get("RIGBASE_DATABASE_URL") or f"sqlite:///{rigbase_home() / 'rigbase.db'}"


def client_config_path() -> Path:
    """The CLI's client config (URL + admin token), written by `provision serve`, mode 0600."""
    return rigbase_home() / "client.json"
