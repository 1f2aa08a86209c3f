"""The control plane's settings (provisioner/settings.py): read once, frozen, the home kept private."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from contracts.errors import InvalidInput
from provisioner.settings import Settings


def test_ensure_home_creates_it_private_and_tightens_a_wider_one(tmp_path: Path) -> None:
    fresh = Settings(home=tmp_path / "new" / "home").ensure_home()
    assert fresh.stat().st_mode & 0o777 == 0o700
    wide = tmp_path / "wide"
    wide.mkdir(mode=0o755)
    wide.chmod(0o755)
    assert Settings(home=wide).ensure_home() == wide
    assert wide.stat().st_mode & 0o777 == 0o700


def test_load_reads_rigbase_variables_with_flags_on_top(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RIGBASE_HOME", str(tmp_path))
    monkeypatch.setenv("RIGBASE_DATABASE_URL", "sqlite:///env.db")
    monkeypatch.setenv("RIGBASE_RECONCILERS", "0")
    settings = Settings.load(database_url=None)
    assert settings.home == tmp_path and settings.database == "sqlite:///env.db" and not settings.reconcilers
    assert Settings.load(database_url="sqlite:///flag.db").database == "sqlite:///flag.db"
    assert settings.client_config == tmp_path / "client.json"
    assert settings.finalize_timeout_s == 30 * 60.0
    with pytest.raises(ValidationError):
        settings.home = Path("/elsewhere")  # frozen


def test_a_bad_value_is_one_line_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RIGBASE_QUOTE_EVERY", "0")
    with pytest.raises(InvalidInput, match="RIGBASE_QUOTE_EVERY"):
        Settings.load()
