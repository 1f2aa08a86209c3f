"""The minion's side of desired state: one handler per key of the heartbeat response's `desired`.

A handler gets the desired value and returns the actual value to report on the next heartbeat (e.g.
the reservations handler publishes over mDNS/UPnP and returns each reservation's state). Handlers
register with one decorator line in their own module, so the heartbeat loop stays the same as new
resources arrive."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Handler = Callable[[Any], Any]

HANDLERS: dict[str, Handler] = {}


def handles(key: str) -> Callable[[Handler], Handler]:
    def deco(fn: Handler) -> Handler:
        HANDLERS[key] = fn
        return fn

    return deco


def apply(desired: dict[str, Any]) -> dict[str, Any]:
    """Apply every key we have a handler for; return the actual state to report."""
    actual: dict[str, Any] = {}
    for key, value in desired.items():
        handler = HANDLERS.get(key)
        if handler is not None:
            actual[key] = handler(value)
    return actual
