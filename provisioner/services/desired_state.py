"""What a node should be doing, and what it reports it is doing, assembled from every resource.

The heartbeat response carries `desired` (one key per contributor: maintenance, reservations,
device_config, …) and the heartbeat request carries `actual` with the same keys. Each resource
module registers its contributor and its reporter here with one call, so the heartbeat route never
grows a branch per resource."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from sqlalchemy.orm import Session

Contributor = Callable[[Session, Any], Any]  # (session, node) -> JSON-able desired value
Reporter = Callable[[Session, Any, Any], None]  # (session, node, reported actual value) -> None
# (the beating node's id column) -> a boolean SQL expression, correlated to it: false when a read would find
# nothing for the node
CouldFind = Callable[[Any], Any]

CONTRIBUTORS: dict[str, Contributor] = {}
REPORTERS: dict[str, Reporter] = {}
# The store reads a beat makes for its contributors and reporters, by name, each with the question that
# tells whether it could find anything. The heartbeat asks them all in its first query (services/heartbeat.py)
# and the reads answered "nothing" are not made: most nodes serve no reservation and run no job, and those
# reads finding nothing were most of a steady beat's statements.
SKIPPABLE_READS: dict[str, CouldFind] = {}

T = TypeVar("T")
_MEMO = "rigbase.beat_memo"  # the key in Session.info while a beat is open (`one_beat`)
_NOTHING = "rigbase.nothing_to_read"  # in the memo: the SKIPPABLE_READS this beat needs not make


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


def skippable_read(name: str, could_find: CouldFind) -> None:
    """Register a per-beat read (see SKIPPABLE_READS); its module checks `nothing_to_read` before it."""
    SKIPPABLE_READS[name] = could_find


def record_nothing_to_read(session: Session, names: Iterable[str]) -> None:
    """In a beat (`one_beat`): the store said these reads would find nothing for the beating node."""
    cache: dict[Hashable, Any] | None = session.info.get(_MEMO)
    if cache is not None:
        cache[_NOTHING] = frozenset(names)


def nothing_to_read(session: Session, name: str) -> bool:
    """True when this beat already knows the read `name` would find nothing (never outside a beat)."""
    cache: dict[Hashable, Any] | None = session.info.get(_MEMO)
    return cache is not None and name in cache.get(_NOTHING, ())


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
