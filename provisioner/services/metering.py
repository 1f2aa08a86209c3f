"""Metering: turn the run time of job workers into ledger entries, hour by hour (docs/billing.md).

A job's hours are counted from its start (`jobs.started_at`, when all its workers run) to its end
(`jobs.ended_at`); each worker is charged for each hour once it is over, and for the partial last hour once
the job stopped (domain.billing_rules.pieces). Every entry's key is (rule, job, worker, hour), unique in
the store, so a pass may be repeated, interrupted or run twice at once: the ledger ends the same. A job
is done with when the ledger holds an entry for its last, stopping piece (period_end = ended_at).

Which account pays is decided from the job as it is stored: the project's account (usage fee or public
price), the creator's account `jobs.account_id` (federated fee), the region's account (earnings)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import and_, exists, func, or_, select
from sqlalchemy.orm import Session

from provisioner.domain import billing_rules as rules
from provisioner.domain.billing_rules import JobFacts, Subject
from provisioner.services import ledger, prices
from provisioner.services.ledger import NewEntry
from provisioner.store.account_models import Project
from provisioner.store.billing_models import LedgerEntry
from provisioner.store.job_models import Job, JobWorker
from provisioner.store.models import Region

BATCH = 500  # jobs per transaction in the reconciler
_JOB_COLUMNS = (
    Job.id,
    Job.type,
    Job.spec,
    Job.account_id,
    Job.region_id,
    Job.gpu_type,
    Job.price_per_gpu_hour,
    Job.started_at,
    Job.ended_at,
)


def _facts(session: Session, row: Any) -> JobFacts:
    """The JobFacts of one row of `_JOB_COLUMNS`."""
    resources = (row.spec or {}).get("resources") or {}
    gpus = int(resources.get("gpu_count") or 0)
    gpu_type = row.gpu_type if gpus > 0 else None
    if row.price_per_gpu_hour is not None:
        price = rules.credits(Decimal(str(row.price_per_gpu_hour)))  # locked at create (a float column)
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
    """Jobs that ran and whose last piece is not in the ledger yet."""
    final = exists().where(LedgerEntry.job_id == Job.id, LedgerEntry.period_end == Job.ended_at)
    return and_(
        Job.started_at.is_not(None),
        Job.region_id.is_not(None),
        or_(Job.ended_at.is_(None), and_(Job.ended_at > Job.started_at, ~final)),
    )


def due_job_ids(session: Session) -> list[str]:
    return list(session.scalars(select(Job.id).where(_unfinished()).order_by(Job.id)))  # type: ignore[arg-type]


def meter_jobs(session: Session, job_ids: Sequence[str], now: datetime) -> int:
    """Post every piece of these jobs that is over at `now` and not posted yet; how many entries were new."""
    if not job_ids:
        return 0
    posted = dict(
        session.execute(
            select(LedgerEntry.job_id, func.max(LedgerEntry.hour))
            .where(LedgerEntry.job_id.in_(job_ids))
            .group_by(LedgerEntry.job_id)
        ).all()
    )
    workers: dict[str, list[int]] = {}
    for job_id, index in session.execute(
        select(JobWorker.job_id, JobWorker.index)
        .where(JobWorker.job_id.in_(job_ids))
        .order_by(JobWorker.index)
    ):
        workers.setdefault(job_id, []).append(index)
    # plain rows, not ORM objects: a pass over 10,000 jobs must take well under a second
    query = (
        select(
            *_JOB_COLUMNS,
            Project.account_id.label("project_account"),
            Region.account_id.label("region_account"),
        )
        .join(Project, Project.id == Job.project_id)
        .outerjoin(Region, Region.id == Job.region_id)
        .where(Job.id.in_(job_ids))
    )
    out: list[NewEntry] = []
    for row in session.execute(query):
        if row.started_at is None:
            continue
        last = posted.get(row.id)
        first = 0 if last is None else int(last) + 1
        todo = rules.pieces(row.started_at, row.ended_at, now, first=first)
        if not todo:
            continue
        facts = _facts(session, row)
        for piece in todo:
            out.extend(entries_for(facts, workers.get(row.id) or [0], piece))
    return ledger.post(session, out)


@dataclass(frozen=True)
class MeterResult:
    jobs: int
    entries: int


def meter(session: Session, now: datetime) -> MeterResult:
    """One metering pass over every job that is due, in this session's transaction."""
    ids = due_job_ids(session)
    return MeterResult(jobs=len(ids), entries=meter_jobs(session, ids, now))
