"""The minion's side of desired state: one handler per key of the heartbeat response's `desired`.

A handler gets the desired value and returns the actual value to report on the next heartbeat (e.g.
the reservations handler publishes over mDNS/UPnP and returns each reservation's state). Handlers
register with one decorator line in their own module, so the heartbeat loop stays the same as new
resources arrive."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

Handler = Callable[[Any], Any]

HANDLERS: dict[str, Handler] = {}
# modules whose import registers handlers; imported on the first apply() (they keep zeroconf etc.
# inside their functions, so neither importing them nor `minion --help` pulls in heavy libraries)
HANDLER_MODULES: tuple[str, ...] = (
    "minion.reservations.heartbeat",  # reservations
)


def handles(key: str) -> Callable[[Handler], Handler]:
    def deco(fn: Handler) -> Handler:
        HANDLERS[key] = fn
        return fn

    return deco


def load_handlers() -> None:
    for module in HANDLER_MODULES:
        importlib.import_module(module)


def apply(desired: dict[str, Any]) -> dict[str, Any]:
    """Apply every key we have a handler for; return the actual state to report."""
    load_handlers()
    actual: dict[str, Any] = {}
    for key, value in desired.items():
        handler = HANDLERS.get(key)
        if handler is not None:
            actual[key] = handler(value)
    return actual


# Cleanup when `minion run` stops (SIGTERM): e.g. the reservations agent sends its mDNS goodbyes and
# removes its UPnP mappings. Registered by whoever starts something long-lived; run newest first.
SHUTDOWN: list[Callable[[], None]] = []


def on_shutdown(fn: Callable[[], None]) -> Callable[[], None]:
    SHUTDOWN.append(fn)
    return fn


def shutdown() -> list[str]:
    """Run every shutdown hook once (newest first); return the errors instead of stopping at one."""
    errors: list[str] = []
    while SHUTDOWN:
        fn = SHUTDOWN.pop()
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - one failing cleanup must not skip the others
            errors.append(f"{getattr(fn, '__name__', fn)}: {exc}")
    return errors
