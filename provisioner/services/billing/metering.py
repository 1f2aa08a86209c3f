"""Metering: turn the run time of job workers into ledger entries, hour by hour (docs/billing.md).

Each worker's hours are counted from its own start (`job_workers.started_at`, measured by the control
plane: services.jobs) to its own end (`job_workers.ended_at`), at the GPUs, GPU type and price locked where
it was placed; each hour is charged once it is over, and the partial last hour once the worker ended
(domain.billing_rules.pieces). A worker that ended frees its GPUs and stops costing at once, whatever its
job's other workers do. Every entry's key is (rule, job, worker, hour), unique in the store, so a pass may
be repeated, interrupted or run twice at once: the ledger ends the same. A worker is done with when the
ledger holds an entry for its last piece (period_end = its ended_at).

Which account pays is decided from the job as it is stored: the project's account (usage fee or public
price), the creator's account `jobs.account_id` (federated fee), the region's account (earnings)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from functools import lru_cache
from typing import Protocol

from sqlalchemy import and_, exists, func, or_, select
from sqlalchemy.orm import Session

from provisioner.domain import billing_rules as rules
from provisioner.domain.billing_rules import JobFacts, Subject
from provisioner.services.billing import ledger, prices
from provisioner.services.billing.ledger import NewEntry
from provisioner.store.account_models import Project
from provisioner.store.billing_models import LedgerEntry
from provisioner.store.job_models import Job, JobWorker
from provisioner.store.models import Region

# entries per transaction in the reconciler (whole jobs: a batch ends with the job that fills it)
BATCH = 5000
PASS_LIMIT = 100_000  # entries read into memory at once (whole jobs); a pass reads again until done
_WORKER_COLUMNS = (
    JobWorker.job_id.label("id"),
    JobWorker.index.label("worker"),
    Job.type,
    JobWorker.gpu_count,
    Job.account_id,
    Job.region_id,
    JobWorker.gpu_type,
    JobWorker.price_per_gpu_hour,
    JobWorker.started_at,
    JobWorker.ended_at,
)


@lru_cache(maxsize=256)
def _locked_price(value: float) -> Decimal:
    """A job's locked price (a float column, written from a Decimal at create) back to its Decimal."""
    return rules.credits(Decimal(str(value)))


class FactsRow(Protocol):
    """What a worker's JobFacts are made of: a row of `_WORKER_COLUMNS`, or job_cost's view of a loaded
    worker."""

    @property
    def id(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def project_account(self) -> str: ...
    @property
    def account_id(self) -> str: ...
    @property
    def region_account(self) -> str | None: ...
    @property
    def region_id(self) -> str | None: ...
    @property
    def gpu_count(self) -> int | None: ...
    @property
    def gpu_type(self) -> str | None: ...
    @property
    def price_per_gpu_hour(self) -> float | None: ...


def job_facts(session: Session, row: FactsRow) -> JobFacts:
    """The JobFacts the billing rules read for one worker, with its locked price (else today's for its
    type)."""
    gpus = int(row.gpu_count or 0)
    gpu_type = row.gpu_type if gpus > 0 else None
    if row.price_per_gpu_hour is not None:
        price = _locked_price(row.price_per_gpu_hour)
    else:
        price = prices.price_for(session, gpu_type)
    return JobFacts(
        job_id=row.id,
        job_type=row.type,
        project_account=row.project_account,
        creator_account=row.account_id,
        region_account=row.region_account,
        region_id=row.region_id,
        gpu_type=gpu_type,
        gpu_class=prices.gpu_class_of(gpu_type),
        gpus_per_worker=gpus,
        price_per_gpu_hour=price,
    )


def entries_for(facts: JobFacts, workers: Sequence[int], piece: rules.Piece) -> list[NewEntry]:
    out: list[NewEntry] = []
    for worker in workers:
        for charge in rules.charges_for(facts, worker, piece):
            out.append(
                NewEntry(
                    key=charge.key,
                    rule=charge.rule,
                    subject=Subject.JOB_HOUR,
                    payer=charge.payer,
                    payee=charge.payee,
                    amount=charge.amount,
                    quantity=charge.quantity,
                    at=piece.end,
                    job_id=facts.job_id,
                    worker=worker,
                    hour=piece.index,
                    region_id=facts.region_id,
                    gpu_type=facts.gpu_type,
                    period_start=piece.start,
                    period_end=piece.end,
                )
            )
    return out


def _unfinished() -> object:
    """Workers that ran, of a placed job, whose last piece is not in the ledger yet."""
    final = exists().where(
        LedgerEntry.job_id == JobWorker.job_id,
        LedgerEntry.worker == JobWorker.index,
        LedgerEntry.period_end == JobWorker.ended_at,
    )
    return and_(
        JobWorker.started_at.is_not(None),
        Job.region_id.is_not(None),
        or_(JobWorker.ended_at.is_(None), and_(JobWorker.ended_at > JobWorker.started_at, ~final)),
    )


def due_job_ids(session: Session) -> list[str]:
    stmt = select(JobWorker.job_id).join(Job, Job.id == JobWorker.job_id).where(_unfinished())  # type: ignore[arg-type]
    return sorted(set(session.scalars(stmt)))


@dataclass(frozen=True)
class Due:
    jobs: list[list[NewEntry]]  # the entries of each job, in the order of job ids
    more: bool  # stopped at the limit: jobs after the last one here may be due too (read again)


def due_entries(
    session: Session, now: datetime, job_ids: Sequence[str] | None = None, limit: int | None = None
) -> Due:
    """The entries of every due worker (of `job_ids` only, when given) for its pieces that are over at
    `now` and not posted yet, one list per job (a piece is posted whole, all its charges together: the
    next pass starts after the worker's newest hour in the ledger). Whole jobs until `limit` entries: after
    a long outage 10,000 jobs owe weeks of hours, more than memory should hold.

    One query whatever the number of workers, and no id lists sent to the database unless asked (a 500-id
    IN list costs more to render and parse than the rows it selects): the workers with their jobs'
    accounts and their newest posted hour (a correlated max over the (job_id, hour) index)."""
    last_hour = (
        select(func.max(LedgerEntry.hour))
        .where(LedgerEntry.job_id == JobWorker.job_id, LedgerEntry.worker == JobWorker.index)
        .correlate(JobWorker)
        .scalar_subquery()
    )
    rows = (
        select(
            *_WORKER_COLUMNS,
            Project.account_id.label("project_account"),
            Region.account_id.label("region_account"),
            last_hour.label("last_hour"),
        )
        .join(Job, Job.id == JobWorker.job_id)
        .join(Project, Project.id == Job.project_id)
        .outerjoin(Region, Region.id == Job.region_id)
        .where(_unfinished())  # type: ignore[arg-type]
        .order_by(JobWorker.job_id, JobWorker.index)
    )
    if job_ids is not None:
        rows = rows.where(JobWorker.job_id.in_(job_ids))
    limit = PASS_LIMIT if limit is None else limit
    out: list[list[NewEntry]] = []
    total = 0
    current: str | None = None
    for row in session.execute(rows).all():
        first = 0 if row.last_hour is None else int(row.last_hour) + 1
        todo = rules.pieces(row.started_at, row.ended_at, now, first=first)
        if not todo:
            continue
        if row.id != current:
            if total >= limit:
                return Due(out, more=True)
            out.append([])
            current = row.id
        facts = job_facts(session, row)
        entries = [e for piece in todo for e in entries_for(facts, [row.worker], piece)]
        out[-1].extend(entries)
        total += len(entries)
    return Due([job for job in out if job], more=False)


def batches(due: Sequence[Sequence[NewEntry]], size: int = BATCH) -> list[list[NewEntry]]:
    """Whole jobs' entries in batches of about `size` entries (one transaction each)."""
    out: list[list[NewEntry]] = [[]]
    for job in due:
        if len(out[-1]) >= size:
            out.append([])
        out[-1].extend(job)
    return [b for b in out if b]


def meter_jobs(session: Session, job_ids: Sequence[str], now: datetime) -> int:
    """Post every piece of these jobs that is over at `now` and not posted yet; how many entries were new."""
    if not job_ids:
        return 0
    return meter(session, now, job_ids).entries


@dataclass(frozen=True)
class MeterResult:
    jobs: int
    entries: int


def meter(session: Session, now: datetime, job_ids: Sequence[str] | None = None) -> MeterResult:
    """One metering pass over every job that is due (or those of `job_ids`), in this session's
    transaction (read again after each PASS_LIMIT entries: the session sees what it posted)."""
    jobs = entries = 0
    while True:
        due = due_entries(session, now, job_ids)
        jobs += len(due.jobs)
        entries += ledger.post(session, [e for job in due.jobs for e in job])
        if not due.more:
            return MeterResult(jobs=jobs, entries=entries)
