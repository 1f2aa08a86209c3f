"""A report a node's minion sends under a heartbeat key and the control plane keeps on the node (its
object cache, its GPU health): read as the contract's model, and stored only when it changed, so a
steady beat writes nothing for it."""

from __future__ import annotations

import logging
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)


def read(node: Any, model: type[M], value: Any, what: str) -> M | None:
    """`value` as `model`; None, logged, for a report that does not read (a node's fault, not the beat's)."""
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        log.warning("node %s reported unreadable %s (%d problems)", node.name, what, exc.error_count())
        return None


def store_changed(node: Any, column: str, report: BaseModel) -> bool:
    """Keep `report` in the node's `column` unless it holds the same already; whether it changed."""
    stored = report.model_dump(mode="json")
    if stored == getattr(node, column):
        return False
    setattr(node, column, stored)
    return True
