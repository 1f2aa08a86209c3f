"""Reconciler: meter running jobs, charge device days and move earned credits (docs/billing.md).

Every minute (an hour's charge is posted within a minute of the hour ending): one metering pass over every
job that is due, read in one transaction and posted in batches of about services.metering.BATCH entries
(whole jobs) per transaction; then the device fee of every UTC day that is over and not charged
(services/devices/device_fees.py); then the transfer of earned credits for the last complete UTC day. Time is
domain.clock.CLOCK, which tests replace to walk through hours and days. Stateless and idempotent (every
entry has a unique key): a control plane killed mid-pass posts the rest on its next pass, and two control
planes on one PostgreSQL database post each entry once."""

from __future__ import annotations

import logging

from sqlalchemy.orm import Session, sessionmaker

from provisioner.domain import clock
from provisioner.reconcilers.loop import register
from provisioner.services.billing import ledger, metering
from provisioner.services.common.wakeups import Wake
from provisioner.services.devices import device_fees
from provisioner.store.engine import session_scope

log = logging.getLogger("rigbase.reconcilers.metering")


def run_once(sessions: sessionmaker[Session]) -> int:
    """One pass; how many entries it posted."""
    now = clock.now()
    posted, more = 0, True
    while more:  # more than PASS_LIMIT entries due (after an outage): read again after posting these
        with session_scope(sessions) as session:
            due = metering.due_entries(session, now)
        for batch in metering.batches(due.jobs):
            with session_scope(sessions) as session:
                posted += ledger.post(session, batch)
        more = due.more
    with session_scope(sessions) as session:
        posted += device_fees.charge(session, now)
    with session_scope(sessions) as session:
        posted += ledger.transfer_earnings(session, ledger.last_complete_day(now))
    if posted:
        log.info("metering posted %d ledger entries", posted)
    return posted


@register(Wake.METERING, period_s=60.0)
def reconcile(sessions: sessionmaker[Session]) -> None:
    run_once(sessions)
