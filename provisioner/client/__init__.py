"""The operator API's HTTP client, shared by the `provision` commands and the local lab (docs/lab.md).
It sits below both so the lab needs nothing of the CLI, and raises data (ControlPlaneError), not output."""

from provisioner.client.errors import ControlPlaneError
from provisioner.client.http import Client, read_client_config, write_client_config

__all__ = ["Client", "ControlPlaneError", "read_client_config", "write_client_config"]
