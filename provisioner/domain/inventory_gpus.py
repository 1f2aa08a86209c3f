"""A node's GPUs as its inventory report lists them (contracts: the minion's Inventory), summed up: how
many, and the type (the catalogue `model`; one per node, the gpu-single-model rule). The store keeps the
two beside the report (store/models.py Node), so fleet counts need not decode every report."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def gpus_of(inventory: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    """The GPU entries of a report; none when it lists none (or is a summary, e.g. {"gpus": 2})."""
    found = inventory.get("gpus") if isinstance(inventory, Mapping) else None
    return [g for g in found if isinstance(g, Mapping)] if isinstance(found, list) else []


def gpu_type_of(inventory: Mapping[str, Any] | None) -> str | None:
    """The node's GPU type; None for a node without GPUs."""
    models = sorted(
        {str(g.get("model") or g.get("name")) for g in gpus_of(inventory) if g.get("model") or g.get("name")}
    )
    return models[0] if models else None


def gpu_summary(inventory: Mapping[str, Any] | None) -> tuple[int, str | None]:
    """(how many GPUs, their type)."""
    return len(gpus_of(inventory)), gpu_type_of(inventory)
