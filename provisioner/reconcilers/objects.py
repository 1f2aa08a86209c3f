"""Reconciler: read the remote sources of datasets, models and checkpoints into the object store
(services/objects/data_objects.py), and deliver workers' outputs where their specs say
(services/objects/outputs.py: a try per pass, failed after three). Woken when one is created, and every
minute for what a restart left `downloading`: a source is read from its start again, and chunks already
stored are not written twice."""

from __future__ import annotations

import logging

from sqlalchemy.orm import Session, sessionmaker

from provisioner.reconcilers.loop import register
from provisioner.services.common.runtime import runtime_of
from provisioner.services.common.wakeups import Wake
from provisioner.services.objects import data_objects, outputs
from provisioner.store.engine import session_scope

log = logging.getLogger("rigbase.reconcilers.objects")


def run_once(sessions: sessionmaker[Session]) -> int:
    """One pass; how many sources it read and outputs it tried to deliver."""
    done = deliver_outputs(sessions)
    with session_scope(sessions) as session:
        done += data_objects.purge_inputs(session)
    while True:
        with session_scope(sessions) as session:
            due = data_objects.pending(session)
            work = runtime_of(session).settings.home / "ingest"
        if not due:
            return done
        work.mkdir(parents=True, exist_ok=True, mode=0o700)
        for item in due:
            log.info("reading %s for object %s", item.source.uri, item.id)
            data_objects.ingest(sessions, item, work)
            done += 1


def deliver_outputs(sessions: sessionmaker[Session]) -> int:
    """One try for each output waiting to go to a bucket or to become an object."""
    with session_scope(sessions) as session:
        due = outputs.pending(session)
        work = runtime_of(session).settings.home / "ingest"
    work.mkdir(parents=True, exist_ok=True, mode=0o700)
    for job_id, worker in due:
        outputs.deliver(sessions, job_id, worker, work)
    return len(due)


@register(Wake.OBJECTS, period_s=60.0)
def reconcile(sessions: sessionmaker[Session]) -> None:
    run_once(sessions)
