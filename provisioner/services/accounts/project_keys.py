"""A project's third-party keys (docs/accounts.md, "Project keys"): what its jobs use to reach services of
their own, kept per project and never returned.

A key has a kind (KeyKind: a private container registry first) and, for a registry, the registry's host
(`ghcr.io`, `nvcr.io`, `docker.io`, `registry.example.com:5000`); its `key_id` (a username) is shown, its
secret is sealed at rest with the store's sealer and leaves the control plane only inside a heartbeat
answer to the node that pulls a job's image (job_assignments.needs_secrets).

Only the project's own account sees and sets its keys (members and admins alike, as they create jobs); a
project shared with another account lends that account's jobs its regions, never its keys: a federated
job pulls anonymously."""

from __future__ import annotations

import re

from sqlalchemy import select
from sqlalchemy.orm import Session

from contracts.errors import InvalidInput, NotFound, RuleViolation
from contracts.images import REGISTRY_HOST, registry_of
from contracts.jobs import RegistryAuth
from contracts.jobspec import KEY_VARIABLES
from provisioner.domain.key_kinds import DEFAULT_NAME, KeyKind
from provisioner.domain.roles import Action, Principal
from provisioner.services.accounts import projects
from provisioner.services.common import audit
from provisioner.services.common.runtime import runtime_of
from provisioner.store.account_models import Project, ProjectKey
from provisioner.store.job_models import Job

KIND = "project key"
PRESENT = projects.PRESENT
SECRET_MAX = 8192


_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")


def _checked(kind: str, name: str, key_id: str, secret: str) -> KeyKind:
    """The key's kind, once its parts fit what an assignment carries (contracts.jobs.RegistryAuth)."""
    try:
        known = KeyKind(kind)
    except ValueError:
        raise InvalidInput(
            f"key kind {kind!r}: use one of {', '.join(k.value for k in KeyKind)}", code="invalid_key"
        ) from None
    if known is not KeyKind.REGISTRY:
        if not _LABEL.fullmatch(name):
            raise InvalidInput(
                f"{known} key name {name[:80]!r}: a lowercase label such as {DEFAULT_NAME} or prod",
                code="invalid_key",
            )
    elif not REGISTRY_HOST.fullmatch(name) or len(name) > 253:
        raise InvalidInput(
            f"registry {name[:80]!r}: give its host[:port], such as ghcr.io, nvcr.io or docker.io",
            code="invalid_key",
        )
    if not 0 < len(key_id) <= 256 or not key_id.isprintable():
        raise InvalidInput("the key's username: 1 to 256 printable characters", code="invalid_key")
    # a GCP key is a service account's JSON file: several lines
    printable = secret.replace("\n", "").isprintable() if known is KeyKind.GCP else secret.isprintable()
    if not 0 < len(secret) <= SECRET_MAX or not printable:
        raise InvalidInput(
            f"the key's secret: 1 to {SECRET_MAX} printable characters (one line)", code="invalid_key"
        )
    return known


def _row(session: Session, project: Project, kind: str, name: str) -> ProjectKey | None:
    return session.scalar(
        select(ProjectKey).where(
            ProjectKey.project_id == project.id, ProjectKey.kind == kind, ProjectKey.name == name
        )
    )


def _noted(session: Session, principal: Principal, project: Project, row: ProjectKey, reason: str) -> None:
    """A line in the key's history (`PROJECT/KIND/NAME`); the secret is never in it."""
    audit.note(
        session,
        kind=KIND,
        resource_id=row.id,
        name=f"{project.name}/{row.kind}/{row.name}",
        actor=principal.actor,
        state=PRESENT,
        reason=reason,
    )


def set_key(
    session: Session,
    principal: Principal,
    project_ref: str,
    *,
    kind: str,
    name: str,
    key_id: str,
    secret: str,
) -> tuple[ProjectKey, bool]:
    """Add the key, or replace the one of that kind and name; returns it and whether it is new."""
    principal.require(Action.MANAGE_PROJECTS)
    project = projects.get(session, principal.account_id, project_ref)
    known = _checked(kind, name, key_id, secret)
    sealed = runtime_of(session).sealer.seal(secret.encode())
    row = _row(session, project, known, name)
    created = row is None
    if row is None:
        row = ProjectKey(project_id=project.id, kind=known.value, name=name, created_by=principal.actor)
        session.add(row)
    row.key_id, row.sealed_secret = key_id, sealed
    session.flush()
    _noted(session, principal, project, row, "added" if created else "replaced")
    return row, created


def list_keys(session: Session, principal: Principal, project_ref: str) -> list[ProjectKey]:
    project = projects.get(session, principal.account_id, project_ref)
    stmt = select(ProjectKey).where(ProjectKey.project_id == project.id)
    return list(session.scalars(stmt.order_by(ProjectKey.kind, ProjectKey.name)))


def remove_key(
    session: Session, principal: Principal, project_ref: str, *, kind: str, name: str
) -> ProjectKey:
    principal.require(Action.MANAGE_PROJECTS)
    project = projects.get(session, principal.account_id, project_ref)
    row = _row(session, project, kind, name)
    if row is None:
        raise NotFound(
            f"project {project.name} has no {kind} key for {name}: "
            f"see `provision project key list {project.name}`",
            code="key_not_found",
        )
    _noted(session, principal, project, row, "removed")
    session.delete(row)
    session.flush()
    return row


def secret_of(session: Session, project_id: str, kind: KeyKind, name: str) -> tuple[str, str] | None:
    """(key id, secret) of the project's key of that kind and name, unsealed; None without one."""
    project = session.get(Project, project_id)
    row = None if project is None else _row(session, project, kind, name)
    if row is None:
        return None
    return row.key_id, runtime_of(session).sealer.unseal(row.sealed_secret).decode()


def _named(ref: str) -> tuple[KeyKind, str]:
    kind, _, name = ref.partition("/")
    return KeyKind(kind), name or DEFAULT_NAME


def check_for_job(session: Session, project: Project, account_id: str, refs: list[str]) -> None:
    """Every key a job names (environment.keys) is the project's own; refused in one line otherwise."""
    if refs and project.account_id != account_id:
        raise RuleViolation(
            f"project {project.name} is shared with your account: it lends its regions, never its keys; "
            "remove environment.keys, or run the job in a project of your own",
            code="keys_not_lent",
        )
    for ref in refs:
        kind, name = _named(ref)
        if _row(session, project, kind, name) is None:
            raise NotFound(
                f"environment.keys: project {project.name} has no {kind} key {name!r}: add it with "
                f"`provision project key set {project.name} --kind {kind} --name {name} -u ID "
                "--secret-file FILE`",
                code="key_not_found",
            )


def job_variables(session: Session, job: Job, refs: list[str]) -> dict[str, str]:
    """The variables the job's named keys become (contracts.jobspec.KEY_VARIABLES); a key removed since the
    job was created gives none (its tool then says it has no credentials)."""
    out: dict[str, str] = {}
    for ref in refs:
        kind, name = _named(ref)
        found = secret_of(session, job.project_id, kind, name)
        if found is None:
            continue
        id_var, secret_var = KEY_VARIABLES[kind.value]
        if id_var is not None:
            out[id_var] = found[0]
        out[secret_var] = found[1]
    return out


def registry_auth(session: Session, job: Job, image: str) -> RegistryAuth | None:
    """The registry key of the job's own project for its image's registry; None for a federated job (its
    account does not own the project) or where the project has none."""
    project = session.get(Project, job.project_id)
    if project is None or project.account_id != job.account_id:
        return None
    registry = registry_of(image)
    row = _row(session, project, KeyKind.REGISTRY, registry)
    if row is None:
        return None
    secret = runtime_of(session).sealer.unseal(row.sealed_secret).decode()
    return RegistryAuth(registry=registry, username=row.key_id, password=secret)
