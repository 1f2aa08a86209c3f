"""The deployment's relaying processes (store table relay_peers): each `provision serve` process that
relays node tunnels to other hosts says where it listens and keeps saying it; the others read who lives.
A process that stops removes its row; one that dies stops being read once its last word is PEER_TTL old."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Final

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from provisioner.store.models import RelayPeer

# a process renews its row every PEER_RENEW; three renewals missed and it is no longer asked
PEER_RENEW: Final = timedelta(seconds=10)
PEER_TTL: Final = 3 * PEER_RENEW


def renew(session: Session, tag: str, url: str, now: datetime | None = None) -> None:
    now = now or datetime.now(UTC)
    row = session.get(RelayPeer, tag)
    if row is None:
        session.add(RelayPeer(tag=tag, url=url, seen_at=now))
    else:
        row.url, row.seen_at = url, now
    # the rows of processes that died without removing theirs: nothing reads them, so nothing keeps them
    session.execute(delete(RelayPeer).where(RelayPeer.seen_at < now - 10 * PEER_TTL))


def forget(session: Session, tag: str) -> None:
    session.execute(delete(RelayPeer).where(RelayPeer.tag == tag))


def living(session: Session, but: str, now: datetime | None = None) -> dict[str, str]:
    """tag → URL of every relaying process heard from within PEER_TTL, but the one tagged `but`."""
    now = now or datetime.now(UTC)
    rows = session.execute(
        select(RelayPeer.tag, RelayPeer.url).where(RelayPeer.seen_at >= now - PEER_TTL, RelayPeer.tag != but)
    )
    return {tag: url for tag, url in rows}
