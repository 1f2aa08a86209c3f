"""What a node should be doing, and what it reports it is doing, assembled from every resource.

The heartbeat response carries `desired` (one key per contributor: maintenance, reservations,
device_config, …) and the heartbeat request carries `actual` with the same keys. Each resource
module registers its contributor and its reporter here with one call, so the heartbeat route never
grows a branch per resource."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session

Contributor = Callable[[Session, Any], Any]  # (session, node) -> JSON-able desired value
Reporter = Callable[[Session, Any, Any], None]  # (session, node, reported actual value) -> None

CONTRIBUTORS: dict[str, Contributor] = {}
REPORTERS: dict[str, Reporter] = {}


def contributes(key: str) -> Callable[[Contributor], Contributor]:
    def deco(fn: Contributor) -> Contributor:
        CONTRIBUTORS[key] = fn
        return fn

    return deco


def reports(key: str) -> Callable[[Reporter], Reporter]:
    def deco(fn: Reporter) -> Reporter:
        REPORTERS[key] = fn
        return fn

    return deco


def desired_for(session: Session, node: Any) -> dict[str, Any]:
    return {key: fn(session, node) for key, fn in CONTRIBUTORS.items()}


def record_actual(session: Session, node: Any, actual: dict[str, Any]) -> None:
    """Hand each reported key to its reporter; unknown keys (a newer minion) are ignored."""
    for key, value in actual.items():
        reporter = REPORTERS.get(key)
        if reporter is not None:
            reporter(session, node, value)
