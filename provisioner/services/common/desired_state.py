"""What a node should be doing, and what it reports it is doing, assembled from every resource.

The heartbeat response carries `desired` (one key per contributor) and the heartbeat request carries
`actual` with the same keys (contracts/heartbeat_keys.py). Which function contributes or records each key
is listed once, in provisioner/services/beat.py, and handed to the heartbeat as a `HeartbeatKeys`; this
module holds that shape and the per-beat memo the contributors share."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy.orm import Session

from contracts.heartbeat_keys import HeartbeatKey

Contributor = Callable[[Session, Any], Any]  # (session, node) -> JSON-able desired value
Reporter = Callable[[Session, Any, Any], None]  # (session, node, reported actual value) -> None
# (the beating node's id column) -> a boolean SQL expression, correlated to it: false when a read would find
# nothing for the node
CouldFind = Callable[[Any], Any]

T = TypeVar("T")
_MEMO = "rigbase.beat_memo"  # the key in Session.info while a beat is open (`one_beat`)
_NOTHING = "rigbase.nothing_to_read"  # in the memo: the skippable reads this beat needs not make


@dataclass(frozen=True, eq=False)
class HeartbeatKeys:
    """Every key's contributor and reporter, and the skippable reads they make, by name."""

    contributors: Mapping[HeartbeatKey, Contributor]
    reporters: Mapping[HeartbeatKey, Reporter]
    skippable_reads: Mapping[str, CouldFind]

    def desired_for(self, session: Session, node: Any) -> dict[str, Any]:
        return {key.value: fn(session, node) for key, fn in self.contributors.items()}

    def record_actual(self, session: Session, node: Any, actual: dict[str, Any]) -> None:
        """Hand each reported key to its reporter; unknown keys (a newer minion) are ignored."""
        for name, value in actual.items():
            try:
                reporter = self.reporters.get(HeartbeatKey(name))
            except ValueError:
                continue
            if reporter is not None:
                reporter(session, node, value)


def record_nothing_to_read(session: Session, names: Iterable[str]) -> None:
    """In a beat (`one_beat`): the store said these reads (HeartbeatKeys.skippable_reads) would find
    nothing for the beating node."""
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
