"""The minion's side of desired state: one handler per key of the heartbeat answer's `desired`
(contracts/heartbeat_keys.py).

A handler gets the desired value and returns the actual value to report on the next heartbeat (e.g.
the reservations handler publishes over mDNS/UPnP and returns each reservation's state). Every handler
is registered the one way, `register(key, handler)`: `minion run` calls each module of its RUN_HOOKS
(minion/join/run.py) once and the module registers its own, so the heartbeat loop stays the same as new
keys arrive. A module may register again to replace its handler (the reservations agent, once started)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from contracts.heartbeat_keys import HeartbeatKey

Handler = Callable[[Any], Any]

_HANDLERS: dict[HeartbeatKey, Handler] = {}


def register(key: HeartbeatKey, handler: Handler) -> None:
    """`handler` serves `key` from the next apply() on; a key the contract does not define is refused."""
    if not isinstance(key, HeartbeatKey):
        raise TypeError(f"{key!r} is not a HeartbeatKey: name the key in contracts/heartbeat_keys.py")
    _HANDLERS[key] = handler


def handler_for(key: HeartbeatKey) -> Handler | None:
    return _HANDLERS.get(key)


def apply(desired: dict[str, Any]) -> dict[str, Any]:
    """Apply every key we have a handler for; return the actual state to report. A key this minion does
    not know (a newer control plane's) is left alone."""
    actual: dict[str, Any] = {}
    for name, value in desired.items():
        try:
            handler = _HANDLERS.get(HeartbeatKey(name))
        except ValueError:
            continue
        if handler is not None:
            actual[name] = handler(value)
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
        except Exception as exc:
            errors.append(f"{getattr(fn, '__name__', fn)}: {exc}")
    return errors
