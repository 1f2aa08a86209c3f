"""What a node should be doing, and what it reports it is doing, assembled from every resource.

The heartbeat response carries `desired` (one key per contributor: maintenance, reservations,
device_config, …) and the heartbeat request carries `actual` with the same keys. Each resource
module registers its contributor and its reporter here with one call, so the heartbeat route never
grows a branch per resource."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from sqlalchemy.orm import Session

Contributor = Callable[[Session, Any], Any]  # (session, node) -> JSON-able desired value
Reporter = Callable[[Session, Any, Any], None]  # (session, node, reported actual value) -> None

CONTRIBUTORS: dict[str, Contributor] = {}
REPORTERS: dict[str, Reporter] = {}

T = TypeVar("T")
_MEMO = "rigbase.beat_memo"  # the key in Session.info while a beat is open (`one_beat`)


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


@contextmanager
def one_beat(session: Session) -> Iterator[None]:
    """While open, `memo` computes each key once: a beat's reporters and contributors ask the same
    questions (the reservations assigned to the node: one reporter, one contributor), and nothing they do
    in between changes the answer. Outside a beat every call computes afresh."""
    session.info[_MEMO] = {}
    try:
        yield
    finally:
        session.info.pop(_MEMO, None)


def memo(session: Session, key: Hashable, compute: Callable[[], T]) -> T:
    """`compute()`, once per key and beat (see `one_beat`)."""
    cache: dict[Hashable, Any] | None = session.info.get(_MEMO)
    if cache is None:
        return compute()
    if key not in cache:
        cache[key] = compute()
    result: T = cache[key]
    return result
