"""The address a node's minion connects from, as the control plane sees it (the HTTP client host of its
proof and heartbeats). Kept in the node's report (`inventory.observed_address`, an existing JSON field,
so no schema change) and given to the compute nodes of a central region as their storage node's NFS server
when the operator set no hostname (provisioner/services/fleet/finalize.py).
Behind a reverse proxy this is the proxy's address: set `--hostname` on such nodes."""

from __future__ import annotations

from typing import Any

from provisioner.store.models import Node

KEY = "observed_address"


def record(node: Node, address: str | None) -> None:
    """Remember `address` (a new dict, so SQLAlchemy sees the JSON change; unchanged → no write)."""
    changed = inventory_to_store(node, None, address)
    if changed is not None:
        node.inventory = changed


def with_observed(inventory: dict[str, Any] | None, address: str | None) -> dict[str, Any] | None:
    """A reported inventory as `record` would leave it stored: with `address` in it. Storing this rather
    than the bare report saves a second write of the inventory in the same beat."""
    if inventory is None or not address:
        return inventory
    return {**inventory, KEY: address}


def inventory_to_store(
    node: Node, reported: dict[str, Any] | None, address: str | None
) -> dict[str, Any] | None:
    """The inventory a beat writes: the reported one with `address` in it, else the stored one when only
    the address changed; None when the stored inventory stays as it is (a steady beat)."""
    if reported is not None:
        return with_observed(reported, address)
    if address and (node.inventory or {}).get(KEY) != address:
        return {**(node.inventory or {}), KEY: address}
    return None


def observed(node: Node) -> str | None:
    value = (node.inventory or {}).get(KEY)
    return value if isinstance(value, str) and value else None
