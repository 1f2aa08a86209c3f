"""The one typed wake-up: services name a reconciler with `Wake`, the loop hears it only after commit."""

from __future__ import annotations

from pathlib import Path

from provisioner.reconcilers.loop import REGISTRY, ReconcilerLoop
from provisioner.services.common import wakeups
from provisioner.services.common.wakeups import Wake, wake_after_commit
from provisioner.store.engine import make_engine, make_sessionmaker


def test_wake_reaches_subscribers_only_once_committed(tmp_path: Path) -> None:
    heard: list[Wake] = []
    wakeups.subscribe(heard.append)
    try:
        sessions = make_sessionmaker(make_engine(f"sqlite:///{tmp_path / 'w.db'}"))
        with sessions() as session:
            wake_after_commit(session, Wake.FINALIZE)
            assert heard == []  # before the commit the reconciler would find nothing to do
            session.commit()
            assert heard == [Wake.FINALIZE]
            session.commit()
            assert heard == [Wake.FINALIZE]  # once per call, not on every later commit
        with sessions() as session:
            wake_after_commit(session, Wake.REGION_HEALTH)
            session.rollback()
        assert heard == [Wake.FINALIZE]
    finally:
        wakeups.unsubscribe(heard.append)


def test_every_reconciler_is_named_by_the_enum(tmp_path: Path) -> None:
    sessions = make_sessionmaker(make_engine(f"sqlite:///{tmp_path / 'w.db'}"))
    loop = ReconcilerLoop(sessions, only=[Wake.FINALIZE])
    assert set(REGISTRY) == set(Wake)
    rec = loop.reconcilers[0]
    loop.wake(Wake.REGION_HEALTH)
    assert not rec.wake.is_set()
    loop.wake(Wake.FINALIZE)
    assert rec.wake.is_set()
