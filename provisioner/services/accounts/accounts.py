"""Accounts: who owns tokens, regions, projects and jobs. Create and list accounts; turn a bearer token
into the Principal that every account-scoped service takes; find the project a request names.

Rules (provisioner/domain/roles.py, docs/accounts.md): the root account's admins create accounts and
see them all; every other token sees only its own account. Another account answers 404 like a missing
one, never its contents."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from contracts.errors import Conflict, NotFound, Unavailable
from contracts.jobs import USERNS_SLOTS
from provisioner.domain.roles import Action, Principal, Role
from provisioner.services.accounts import projects, tokens
from provisioner.services.common import audit, names
from provisioner.store.account_models import Account, Project

__all__ = ["Principal", "Role", "principal_of", "project_for", "create", "list_visible", "get_visible"]

KIND = "account"
PRESENT = projects.PRESENT  # accounts, like projects, only exist: no lifecycle states


def principal_of(session: Session, token: str | None) -> Principal:
    """Who the bearer `token` is (Unauthorized when missing, unknown, revoked or expired)."""
    row = tokens.authenticate(session, token)
    account = session.get(Account, row.account_id)
    if account is None:  # a foreign key keeps this from happening; say so instead of a 500
        raise Unavailable(f"operator token '{row.name}' names no account: the store is inconsistent")
    return Principal(actor=f"operator:{row.name}", account_id=account.id, role=row.role, root=account.root)


def project_for(session: Session, principal: Principal, name_or_id: str | None) -> Project:
    """The project `name_or_id` names for the principal (None: its account's default project): its own,
    or `OWNER/PROJECT` (or the id) of one shared with its account (services/projects.resolve). Another
    account's project not shared with it raises the same NotFound (404) as a missing one."""
    if name_or_id is None:
        return projects.default_of(session, principal.account_id)
    return projects.resolve(session, principal.account_id, name_or_id)


def _not_found(ref: str) -> NotFound:
    return NotFound(f"account '{ref}' does not exist: see `provision account list`", code="account_not_found")


def list_visible(session: Session, principal: Principal) -> list[Account]:
    """Every account for the root account's admins; the principal's own account for everyone else."""
    stmt = select(Account).order_by(Account.created_at, Account.name)
    scope = principal.account_scope()
    if scope is not None:
        stmt = stmt.where(Account.id == scope)
    return list(session.scalars(stmt))


def get_visible(session: Session, principal: Principal, ref: str) -> Account:
    """An account by name or id, if the principal may see it; NotFound otherwise (the same answer)."""
    row = session.scalar(select(Account).where((Account.name == ref) | (Account.id == ref)))
    scope = principal.account_scope()
    if row is None or (scope is not None and row.id != scope):
        raise _not_found(ref)
    return row


def _next_uid_slot(session: Session) -> int:
    """The next user namespace range, never one an account had (a removed account's files on a datastore
    keep its uids). Two creations racing for one slot meet at the store's unique index."""
    slot = int(session.scalar(select(func.coalesce(func.max(Account.uid_slot), -1))) or 0) + 1
    if slot >= USERNS_SLOTS:
        raise Conflict(
            f"the fleet holds its most accounts ({USERNS_SLOTS}): every user namespace range is taken",
            code="no_uid_range",
        )
    return slot


def create(session: Session, principal: Principal, name: str) -> Account:
    """A new account with its default project. Only the root account's admins create accounts; the new
    account's first admin token is `provision token create NAME --account ACCOUNT --role admin`."""
    principal.require(Action.MANAGE_ACCOUNTS)
    names.dns_label(KIND, name)
    if session.scalar(select(Account.id).where(Account.name == name)):
        raise Conflict(f"account '{name}' already exists: choose another name", code="duplicate_name")
    row = Account(name=name, root=False, uid_slot=_next_uid_slot(session))
    session.add(row)
    session.flush()
    audit.record(
        session,
        kind=KIND,
        resource_id=row.id,
        name=name,
        actor=principal.actor,
        from_state=None,
        to_state=PRESENT,
        reason="created",
    )
    projects.add_default(session, row.id, actor=principal.actor)
    return row


def token_account(session: Session, principal: Principal, ref: str | None) -> Account:
    """The account a new token goes to: the principal's own (None), or another one, which only the root
    account's admins may name."""
    principal.require(Action.MANAGE_TOKENS)
    if ref is None:
        own = session.get(Account, principal.account_id)
        assert own is not None
        return own
    account = get_visible(session, principal, ref)
    if account.id != principal.account_id:
        principal.require(Action.MANAGE_ACCOUNTS)
    return account
