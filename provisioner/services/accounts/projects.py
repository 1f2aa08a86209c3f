"""Projects: the unit jobs belong to, inside one account. Create, list, show, remove, always within the
caller's own account: another account's project answers exactly as a missing one does (404, same body),
so a project's name or id tells nothing about who else exists.

Each account has one default project (`default`), created with the account; it is where a job goes when
none is named, and it cannot be removed. A removed project keeps its row (removed_at) for the jobs and
audit trail that name it; its name can be used again.

Sharing (docs/accounts.md "Sharing a project"): the owner account's admins share a project with another
account (`project_shares`); that account's members then name it `OWNER/PROJECT` (or by its id) and create
jobs in it. Such a job is federated: its creator (`jobs.account_id`) is not its project's owner. A share
neither moves the project nor shows the sharee anything but the jobs it created there."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Select, delete, select
from sqlalchemy.orm import Session

from contracts.errors import Conflict, NotFound, RuleViolation
from provisioner.domain.roles import Action, Principal
from provisioner.services.common import audit, names
from provisioner.store.account_models import Account, Project, ProjectShare

KIND = "project"
DEFAULT_NAME = "default"
DESCRIPTION_MAX = 200
# a project has no lifecycle beyond existing: its audit lines go from nothing to PRESENT to GONE
PRESENT = "present"
GONE = "gone"
# a share, like a project, only exists: audit lines of kind SHARE_KIND, under the project's id
SHARE_KIND = "project_share"
SHARED = "shared"
UNSHARED = "unshared"
# why a share or an unshare is refused (code → the one line the operator reads), checked before any write
SHARE_REFUSALS: dict[str, str] = {
    "share_with_self": (
        "project '{project}' already belongs to account '{account}': share it with another account"
    ),
    "not_project_owner": (
        "project '{project}' belongs to account '{owner}': only its admins can share or unshare it"
    ),
    "already_shared": "project '{project}' is already shared with account '{account}'",
    "not_shared": (
        "project '{project}' is not shared with account '{account}': see `provision project show {project}`"
    ),
}


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


def shared_with_account(session: Session, account_id: str) -> list[Project]:
    """The live projects of other accounts shared with `account_id`, by owner and name."""
    stmt = (
        select(Project)
        .join(ProjectShare, ProjectShare.project_id == Project.id)
        .join(Account, Account.id == Project.account_id)
        .where(ProjectShare.account_id == account_id, Project.removed_at.is_(None))
        .order_by(Account.name, Project.name)
    )
    return list(session.scalars(stmt))


def shares_of(session: Session, project: Project) -> list[ProjectShare]:
    """Who `project` is shared with, by account name."""
    stmt = (
        select(ProjectShare)
        .join(Account, Account.id == ProjectShare.account_id)
        .where(ProjectShare.project_id == project.id)
        .order_by(Account.name)
    )
    return list(session.scalars(stmt))


def is_shared_with(session: Session, project: Project, account_id: str) -> bool:
    stmt = select(ProjectShare.id).where(
        ProjectShare.project_id == project.id, ProjectShare.account_id == account_id
    )
    return session.scalar(stmt) is not None


def resolve(session: Session, account_id: str, ref: str) -> Project:
    """The project `ref` names for `account_id`: its own by name or id, or `OWNER/PROJECT` (owner account
    and project by name or id) — its own or one shared with it — or the id of a project shared with it.
    Anything else, another account's project not shared with it included, is the NotFound of a missing
    one."""
    if "/" in ref:
        owner_ref, _, project_ref = ref.partition("/")
        owner = session.scalar(select(Account).where((Account.name == owner_ref) | (Account.id == owner_ref)))
        if owner is None or not project_ref:
            raise _not_found(ref)
        try:
            row = get(session, owner.id, project_ref)
        except NotFound:
            raise _not_found(ref) from None
        if owner.id != account_id and not is_shared_with(session, row, account_id):
            raise _not_found(ref)
        return row
    try:
        return get(session, account_id, ref)
    except NotFound:
        shared = session.scalar(
            select(Project)
            .join(ProjectShare, ProjectShare.project_id == Project.id)
            .where(Project.id == ref, Project.removed_at.is_(None), ProjectShare.account_id == account_id)
        )
        if shared is None:
            raise
        return shared


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


def create(
    session: Session,
    principal: Principal,
    name: str,
    *,
    description: str | None = None,
    notebook_autostop_minutes: int | None = None,
) -> Project:
    principal.require(Action.MANAGE_PROJECTS)
    names.dns_label(KIND, name)
    if session.scalar(_live(principal.account_id).where(Project.name == name)):
        raise Conflict(
            f"project '{name}' already exists in this account: choose another name", code="duplicate_name"
        )
    text = (description or "").strip() or None
    row = _add(session, principal.account_id, name, default=False, description=text, actor=principal.actor)
    row.notebook_autostop_minutes = notebook_autostop_minutes
    return row


def set_notebook_autostop(session: Session, principal: Principal, ref: str, minutes: int | None) -> Project:
    """The project's default autostop for notebooks that name none (0: never; None: the built-in hour).
    Running notebooks follow it from their next report (services/jobs/job_autostop.py)."""
    principal.require(Action.MANAGE_PROJECTS)
    row = get(session, principal.account_id, ref)
    if row.notebook_autostop_minutes == minutes:
        return row
    said = "the built-in default" if minutes is None else ("never" if minutes == 0 else f"{minutes} min")
    row.notebook_autostop_minutes = minutes
    audit.record(
        session,
        kind=KIND,
        resource_id=row.id,
        name=row.name,
        actor=principal.actor,
        from_state=PRESENT,
        to_state=PRESENT,
        reason=f"notebook autostop: {said}",
    )
    return row


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


def _refused(code: str, **words: str) -> RuleViolation:
    return RuleViolation(SHARE_REFUSALS[code].format(**words), code=code)


def _share_target(
    session: Session, principal: Principal, ref: str, account_ref: str
) -> tuple[Project, Account]:
    """The project (the caller's account must own it) and the account named, or a one-line refusal."""
    principal.require(Action.SHARE_PROJECTS)
    project = resolve(session, principal.account_id, ref)
    if project.account_id != principal.account_id:  # a sharee naming OWNER/PROJECT
        raise _refused("not_project_owner", project=ref, owner=project.account.name)
    account = session.scalar(
        select(Account).where((Account.name == account_ref) | (Account.id == account_ref))
    )
    if account is None:
        raise NotFound(
            f"account '{account_ref}' does not exist: check the name with its admins",
            code="account_not_found",
        )
    if account.id == project.account_id:
        raise _refused("share_with_self", project=project.name, account=account.name)
    return project, account


def share(session: Session, principal: Principal, ref: str, account_ref: str) -> Project:
    """Share the caller's project `ref` with account `account_ref`: its members may create jobs there."""
    project, account = _share_target(session, principal, ref, account_ref)
    if is_shared_with(session, project, account.id):
        raise Conflict(
            SHARE_REFUSALS["already_shared"].format(project=project.name, account=account.name),
            code="already_shared",
        )
    session.add(ProjectShare(project_id=project.id, account_id=account.id, created_by=principal.actor))
    session.flush()
    _audit_share(session, principal, project, account, SHARED)
    return project


def unshare(session: Session, principal: Principal, ref: str, account_ref: str) -> Project:
    """Stop sharing: the account creates no more jobs there; the jobs it created run on, seen by both."""
    project, account = _share_target(session, principal, ref, account_ref)
    if not is_shared_with(session, project, account.id):
        raise _refused("not_shared", project=project.name, account=account.name)
    session.execute(
        delete(ProjectShare).where(
            ProjectShare.project_id == project.id, ProjectShare.account_id == account.id
        )
    )
    _audit_share(session, principal, project, account, UNSHARED)
    return project


def _audit_share(session: Session, principal: Principal, project: Project, account: Account, to: str) -> None:
    audit.record(
        session,
        kind=SHARE_KIND,
        resource_id=project.id,
        name=f"{project.name} with {account.name}",
        actor=principal.actor,
        from_state=UNSHARED if to == SHARED else SHARED,
        to_state=to,
        reason=f"{to} with account {account.name}",
    )
