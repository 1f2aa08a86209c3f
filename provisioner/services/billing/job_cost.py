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
from provisioner.store.job_models import Job


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
    """A loaded Job as metering's FactsRow."""

    id: str
    type: str
    project_account: str
    account_id: str
    region_account: str | None
    region_id: str | None
    gpu_count: int | None
    gpu_type: str | None
    price_per_gpu_hour: float | None


def facts_of(session: Session, job: Job) -> JobFacts:
    """The JobFacts metering reads for a job, from its loaded row."""
    row = _JobRow(
        id=job.id,
        type=job.type,
        project_account=job.project.account_id,
        account_id=job.account_id,
        region_account=job.region.account_id if job.region is not None else None,
        region_id=job.region_id,
        gpu_count=int((job.spec.get("resources") or {}).get("gpu_count") or 0),
        gpu_type=job.gpu_type,
        price_per_gpu_hour=job.price_per_gpu_hour,
    )
    return metering.job_facts(session, row)


def _paid(facts: JobFacts, workers: int, piece: Piece) -> Decimal:
    """What the job's side pays for `workers` workers over `piece`."""
    per_worker = sum(
        (c.amount for c in rules.charges_for(facts, 0, piece) if c.payee == rules.PLATFORM), Decimal(0)
    )
    return per_worker * workers


def _open_pieces(job: Job, first: int, now: datetime) -> list[Piece]:
    """The run's hours from `first` that metering has not posted: those over at `now`, then the hour it is
    in (cut at `now`)."""
    assert job.started_at is not None
    done = rules.pieces(job.started_at, job.ended_at, now, first=first)
    if job.ended_at is not None:
        return done
    index = done[-1].index + 1 if done else first
    start = job.started_at + index * rules.METERING_PERIOD
    return [*done, Piece(index, start, now)] if now > start else done


def costs(session: Session, jobs: Sequence[Job], now: datetime) -> dict[str, JobCost]:
    """Each job's cost at `now` (module docstring)."""
    ids = [j.id for j in jobs]
    posted = {
        job_id: (int(micros or 0), last_hour)
        for job_id, micros, last_hour in session.execute(
            select(
                LedgerEntry.job_id,
                func.sum(LedgerEntry.amount_micros).filter(LedgerEntry.payee == rules.PLATFORM),
                func.max(LedgerEntry.hour),
            )
            .where(LedgerEntry.job_id.in_(ids))
            .group_by(LedgerEntry.job_id)
        )
    }
    out: dict[str, JobCost] = {}
    for job in jobs:
        micros, last_hour = posted.get(job.id, (0, None))
        charged = rules.from_micros(micros)
        if job.started_at is None or job.region_id is None:
            out[job.id] = JobCost(None, charged, Decimal(0), None)
            continue
        end = job.ended_at or now
        facts = facts_of(session, job)
        workers = max(1, len(job.workers))
        first = 0 if last_hour is None else int(last_hour) + 1
        accrued = sum((_paid(facts, workers, p) for p in _open_pieces(job, first, now)), Decimal(0))
        hour = Piece(0, job.started_at, job.started_at + rules.METERING_PERIOD)
        out[job.id] = JobCost(
            duration_s=max(0.0, (end - job.started_at).total_seconds()),
            charged=charged,
            accrued=rules.credits(accrued),
            per_hour=_paid(facts, workers, hour) if job.ended_at is None else None,
        )
    return out
