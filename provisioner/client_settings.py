"""Where a `provision` command connects: the four settings a client reads (RIGBASE_HOME, RIGBASE_URL,
RIGBASE_TOKEN, RIGBASE_CA_CERT), read without the control plane's Settings, whose pydantic-settings import
cost every command about 90 ms. Settings declares the same four fields under the same prefix and hands
them over as ClientSettings (`Settings.client_settings`); tests/provisioner/test_cli_start.py checks that
both read one environment alike."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

ENV_PREFIX: Final = "RIGBASE_"
CLIENT_CONFIG: Final = "client.json"


def default_home() -> Path:
    return Path.home() / ".local" / "share" / "rigbase"


@dataclass(frozen=True)
class ClientSettings:
    home: Path
    url: str | None = None
    token: str | None = None
    ca_cert: Path | None = None

    @property
    def client_config(self) -> Path:
        """The CLI's client config (URL + admin token), written by `provision serve`, mode 0600."""
        return self.home / CLIENT_CONFIG

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> ClientSettings:
        # pydantic-settings matches the names whatever their case; so does this
        env = {k.upper(): v for k, v in (os.environ if environ is None else environ).items()}

        def given(name: str) -> str | None:
            return env.get(ENV_PREFIX + name.upper()) or None

        home, ca = given("home"), given("ca_cert")
        return cls(
            home=Path(home) if home else default_home(),
            url=given("url"),
            token=given("token"),
            ca_cert=Path(ca) if ca else None,
        )
