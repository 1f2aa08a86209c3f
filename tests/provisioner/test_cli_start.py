"""What a `provision` command loads before its request: the client's four settings come from
provisioner/client_settings.py, which must read an environment as the control plane's Settings does, and
a command that only talks to the API never imports pydantic-settings, trio or the store."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from provisioner.client_settings import ClientSettings
from provisioner.settings import Settings
from tests.fixtures.control_plane import PROVISION, ControlPlane


@pytest.mark.parametrize(
    "environ",
    [
        {},
        {"RIGBASE_HOME": "/srv/rigbase"},
        {"RIGBASE_URL": "https://cp.lan:8470", "RIGBASE_TOKEN": "rbo_x", "RIGBASE_CA_CERT": "/etc/ca.pem"},
        {"rigbase_url": "https://lower.case:1", "RIGBASE_HOME": "relative/home"},  # any case, as pydantic
    ],
)
def test_the_client_reads_its_settings_as_the_control_plane_does(
    environ: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("RIGBASE_HOME", "RIGBASE_URL", "RIGBASE_TOKEN", "RIGBASE_CA_CERT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    light = ClientSettings.from_environ()
    assert light == Settings.load().client_settings
    assert light.client_config == Settings.load().client_config


def test_a_command_that_asks_the_api_loads_none_of_the_servers_code(api_server: ControlPlane) -> None:
    # the console script's own process; at exit it writes the modules it holds (None: marked absent)
    probe = (
        "import atexit, json, runpy, sys; "
        "atexit.register(lambda: sys.stderr.write(json.dumps([n for n, m in sys.modules.items() if m]))); "
        "sys.argv = [sys.argv[1], 'node', 'list', '--json']; runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    shown = subprocess.run(
        [sys.executable, "-c", probe, str(PROVISION)],
        env=api_server.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert shown.stdout.strip() == "[]"
    loaded = {name.split(".")[0] for name in json.loads(shown.stderr)} | set(json.loads(shown.stderr))
    for heavy in ("pydantic_settings", "trio", "sqlalchemy", "cryptography", "provisioner.settings"):
        assert heavy not in loaded, f"`provision node list` imported {heavy}"
    assert "httpx" in loaded and "provisioner.cli.nodes" in loaded  # the probe saw the imports


def test_the_console_script_is_the_entry_that_keeps_trio_out() -> None:
    script = Path(PROVISION).read_text()
    assert "from provisioner.cli.entry import main" in script, script
