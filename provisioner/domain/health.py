"""What a region's health is decided from, as plain data: the region-health reconciler builds a
RegionHealthView from the store and asks the region's provider driver (providers/base.py
`unhealthy_because`) whether it can serve. One reconciler, one rule per provider."""

from __future__ import annotations

from dataclasses import dataclass

from provisioner.domain.states import NodeState


@dataclass(frozen=True)
class StorageNodeView:
    name: str
    state: NodeState
    reporting: bool  # heartbeated within the online window
    vm_running: bool | None  # a cloud storage node's VM as the provider last said; None for own hardware


@dataclass(frozen=True)
class RegionHealthView:
    name: str
    nodes_reporting: int  # nodes (storage node included) that heartbeated within the online window
    storage_node: StorageNodeView | None
