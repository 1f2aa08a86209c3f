"""A job's outputs as its owner reads them (services/objects/outputs.py keeps and delivers them): by the
job's name or id, with the job's own visibility, so another account's job answers 404."""

from __future__ import annotations

from sqlalchemy.orm import Session

from contracts.errors import NotFound
from provisioner.domain.roles import Principal
from provisioner.services.jobs import jobs
from provisioner.services.objects import outputs
from provisioner.store.data_models import JobOutput


def list_outputs(session: Session, principal: Principal, ref: str) -> list[JobOutput]:
    return outputs.of_job(session, jobs.get(session, principal, ref).id)


def output(session: Session, principal: Principal, ref: str, worker: int) -> JobOutput:
    job = jobs.get(session, principal, ref)
    row = session.get(JobOutput, (job.id, worker))
    if row is None:
        raise NotFound(
            f"worker {worker} of job '{job.name}' has left no output yet (one is kept when a worker with its "
            "own /opt/ml/output ends): see `provision job output " + job.name + "`",
            code="output_not_found",
        )
    return row
