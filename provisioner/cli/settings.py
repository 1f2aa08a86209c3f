"""The settings of one `provision` command, loaded once per process (provisioner/settings.py), and the
API client they point at. Every command asks here instead of reading the environment."""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

from contracts.errors import RigbaseError
from provisioner.cli.errors import CliError
from provisioner.client import Client
from provisioner.client_settings import ClientSettings

if TYPE_CHECKING:  # pragma: no cover
    from provisioner.settings import Settings


@cache
def settings() -> Settings:
    from provisioner.settings import Settings  # pydantic-settings: only for the commands that need it

    try:
        return Settings.load()
    except RigbaseError as exc:
        raise CliError(exc.message) from exc


def connect() -> Client:
    """The control plane the environment names (RIGBASE_URL / RIGBASE_TOKEN, else the client config in
    RIGBASE_HOME), read without loading every setting (provisioner/client_settings.py)."""
    return Client.from_settings(ClientSettings.from_environ())
