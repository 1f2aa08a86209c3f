"""The most rows one request lists: the API's bounds on its `limit` parameters, which the CLI's `--limit`
options use too (the CLI imports this, not the services, so `provision --help` stays instant)."""

from __future__ import annotations

from typing import Final

NODES_PAGE: Final = 500  # GET /v1/nodes
REFUSALS_PAGE: Final = 500  # GET /v1/join-refusals
CONSOLE_NODES_PAGE: Final = 100  # compute nodes, storage nodes or devices per page of a region's console page
