"""The settings of one `provision` command, loaded once per process (provisioner/settings.py), and the
API client they point at. Every command asks here instead of reading the environment."""

from __future__ import annotations

from functools import cache

from contracts.errors import RigbaseError
from provisioner.cli.errors import CliError
from provisioner.client import Client
from provisioner.settings import Settings


@cache
def settings() -> Settings:
    try:
        return Settings.load()
    except RigbaseError as exc:
        raise CliError(exc.message) from exc


def connect() -> Client:
    """The control plane the settings name (RIGBASE_URL / RIGBASE_TOKEN, else the client config)."""
    return Client.from_settings(settings())
