"""Projects: the unit jobs belong to, inside one account. Create, list, show, remove, always within the
caller's own account: another account's project answers exactly as a missing one does (404, same body),
so a project's name or id tells nothing about who else exists.

Each account has one default project (`default`), created with the account; it is where a job goes when
none is named, and it cannot be removed. A removed project keeps its row (removed_at) for the jobs and
audit trail that name it; its name can be used again."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from contracts.errors import Conflict, NotFound, RuleViolation
from provisioner.domain.roles import Action, Principal
from provisioner.services import audit, names
from provisioner.store.account_models import Project

KIND = "project"
DEFAULT_NAME = "default"
DESCRIPTION_MAX = 200
# a project has no lifecycle beyond existing: its audit lines go from nothing to PRESENT to GONE
PRESENT = "present"
GONE = "gone"


def project_has_jobs(session: Session, project: Project) -> bool:
    """Whether `project` still has jobs that keep it from being removed: one that has not ended (an ended
    job keeps naming the project's kept row)."""
    from provisioner.domain.states import JOB_LIVE
    from provisioner.store.job_models import Job

    live = [s.value for s in JOB_LIVE]
    return (
        session.scalar(select(Job.id).where(Job.project_id == project.id, Job.state.in_(live)).limit(1))
        is not None
    )


def _live(account_id: str) -> Select[Any]:
    return select(Project).where(Project.account_id == account_id, Project.removed_at.is_(None))


def _not_found(ref: str) -> NotFound:
    return NotFound(f"project '{ref}' does not exist: see `provision project list`", code="project_not_found")


def list_all(session: Session, account_id: str) -> list[Project]:
    return list(session.scalars(_live(account_id).order_by(Project.name)))


def get(session: Session, account_id: str, ref: str) -> Project:
    """A live project of `account_id` by name or id; NotFound for a missing one and another account's."""
    row = session.scalar(_live(account_id).where((Project.name == ref) | (Project.id == ref)))
    if row is None:
        raise _not_found(ref)
    return row


def default_of(session: Session, account_id: str) -> Project:
    row = session.scalar(_live(account_id).where(Project.default.is_(True)))
    if row is None:  # every account is created with one and it cannot be removed
        raise NotFound(
            "this account has no default project: name one with --project (see `provision project list`)",
            code="project_not_found",
        )
    return row


def add_default(session: Session, account_id: str, *, actor: str) -> Project:
    """The default project of a new account (accounts.create)."""
    return _add(session, account_id, DEFAULT_NAME, default=True, description=None, actor=actor)


def _add(
    session: Session, account_id: str, name: str, *, default: bool, description: str | None, actor: str
) -> Project:
    row = Project(account_id=account_id, name=name, default=default, description=description)
    session.add(row)
    session.flush()
    audit.record(
        session,
        kind=KIND,
        resource_id=row.id,
        name=name,
        actor=actor,
        from_state=None,
        to_state=PRESENT,
        reason="created",
    )
    return row


def create(session: Session, principal: Principal, name: str, *, description: str | None = None) -> Project:
    principal.require(Action.MANAGE_PROJECTS)
    names.dns_label(KIND, name)
    if session.scalar(_live(principal.account_id).where(Project.name == name)):
        raise Conflict(
            f"project '{name}' already exists in this account: choose another name", code="duplicate_name"
        )
    text = (description or "").strip() or None
    return _add(session, principal.account_id, name, default=False, description=text, actor=principal.actor)


def remove(session: Session, principal: Principal, ref: str) -> Project:
    """Remove a project of the caller's account: refused for the default project and while it has jobs."""
    principal.require(Action.MANAGE_PROJECTS)
    row = get(session, principal.account_id, ref)
    if row.default:
        raise RuleViolation(
            f"project '{row.name}' is the account's default project and cannot be removed",
            code="default_project",
        )
    if project_has_jobs(session, row):
        raise RuleViolation(
            f"project '{row.name}' has jobs: remove or wait for them first (`provision job list --project "
            f"{row.name}`)",
            code="project_in_use",
        )
    row.removed_at = datetime.now(UTC)
    audit.record(
        session,
        kind=KIND,
        resource_id=row.id,
        name=row.name,
        actor=principal.actor,
        from_state=PRESENT,
        to_state=GONE,
        reason="removed",
    )
    return row
