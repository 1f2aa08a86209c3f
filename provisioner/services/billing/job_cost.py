"""What a job has cost so far: the ledger's entries for it, plus what its run accrued since the last hour
the metering posted, priced by the same rules (domain/billing_rules.py), and what one more hour costs
while it runs. For `provision job show`, `job list` and the console; the ledger stays the only record.

Only the job's own side is counted (entries paid to the platform: price, usage fee, federated fee), as
`job_credits` does. Two queries for any number of jobs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from provisioner.domain import billing_rules as rules
from provisioner.domain.billing_rules import JobFacts, Piece
from provisioner.services.billing import metering
from provisioner.store.billing_models import LedgerEntry
from provisioner.store.job_models import Job, JobWorker


@dataclass(frozen=True)
class JobCost:
    duration_s: float | None  # run time: from the start to the end, or to now (None: never started)
    charged: Decimal  # in the ledger
    accrued: Decimal  # run since the last posted hour, not in the ledger yet
    per_hour: Decimal | None  # what the next hour costs while it runs (None: not running)

    @property
    def so_far(self) -> Decimal:
        return self.charged + self.accrued


@dataclass(frozen=True)
class _JobRow:
    """A loaded job's worker as metering's FactsRow."""

    id: str
    type: str
    project_account: str
    account_id: str
    region_account: str | None
    region_id: str | None
    gpu_count: int | None
    gpu_type: str | None
    price_per_gpu_hour: float | None


def facts_of(session: Session, job: Job, worker: JobWorker) -> JobFacts:
    """The JobFacts metering reads for one worker of a job, from its loaded rows."""
    row = _JobRow(
        id=job.id,
        type=job.type,
        project_account=job.project.account_id,
        account_id=job.account_id,
        region_account=job.region.account_id if job.region is not None else None,
        region_id=job.region_id,
        gpu_count=worker.gpu_count,
        gpu_type=worker.gpu_type,
        price_per_gpu_hour=worker.price_per_gpu_hour,
    )
    return metering.job_facts(session, row)


def _paid(facts: JobFacts, piece: Piece) -> Decimal:
    """What the job's side pays for one worker over `piece`."""
    return sum(
        (c.amount for c in rules.charges_for(facts, 0, piece) if c.payee == rules.PLATFORM), Decimal(0)
    )


def _open_pieces(started_at: datetime, ended_at: datetime | None, first: int, now: datetime) -> list[Piece]:
    """A worker's hours from `first` that metering has not posted: those over at `now`, then the hour it
    is in (cut at `now`)."""
    done = rules.pieces(started_at, ended_at, now, first=first)
    if ended_at is not None:
        return done
    index = done[-1].index + 1 if done else first
    start = started_at + index * rules.METERING_PERIOD
    return [*done, Piece(index, start, now)] if now > start else done


def costs(session: Session, jobs: Sequence[Job], now: datetime) -> dict[str, JobCost]:
    """Each job's cost at `now` (module docstring): each of its workers from its own start to its end."""
    ids = [j.id for j in jobs]
    charged: dict[str, int] = {}
    last: dict[tuple[str, int], int] = {}
    for job_id, number, micros, last_hour in session.execute(
        select(
            LedgerEntry.job_id,
            LedgerEntry.worker,
            func.sum(LedgerEntry.amount_micros).filter(LedgerEntry.payee == rules.PLATFORM),
            func.max(LedgerEntry.hour),
        )
        .where(LedgerEntry.job_id.in_(ids))
        .group_by(LedgerEntry.job_id, LedgerEntry.worker)
    ):
        charged[str(job_id)] = charged.get(str(job_id), 0) + int(micros or 0)
        if last_hour is not None:
            last[(str(job_id), int(number or 0))] = int(last_hour)
    out: dict[str, JobCost] = {}
    for job in jobs:
        paid = rules.from_micros(charged.get(job.id, 0))
        if job.started_at is None or job.region_id is None:
            out[job.id] = JobCost(None, paid, Decimal(0), None)
            continue
        accrued = Decimal(0)
        per_hour = Decimal(0)
        for worker in job.workers:
            if worker.started_at is None:
                continue
            facts = facts_of(session, job, worker)
            first = last.get((job.id, worker.index), -1) + 1
            pieces = _open_pieces(worker.started_at, worker.ended_at, first, now)
            accrued += sum((_paid(facts, p) for p in pieces), Decimal(0))
            if worker.ended_at is None:
                hour = Piece(0, worker.started_at, worker.started_at + rules.METERING_PERIOD)
                per_hour += _paid(facts, hour)
        end = job.ended_at or now
        out[job.id] = JobCost(
            duration_s=max(0.0, (end - job.started_at).total_seconds()),
            charged=paid,
            accrued=rules.credits(accrued),
            per_hour=per_hour if job.ended_at is None else None,
        )
    return out
