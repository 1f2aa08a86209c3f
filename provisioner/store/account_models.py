"""Store models: accounts and projects. Who owns what: every operator token belongs to an
account (api_tokens.account_id), every region to the account that created it (regions.account_id), and
every job to a project of an account.

The first start creates the account `default` (the root account: its admins administer every account)
with its default project `default`; revision 0014 does it, and moves the tokens and regions of an older
store to it. A removed project keeps its row (`removed_at`) for the jobs and audit trail that name it,
so its name is unique among the account's live projects only (a partial unique index).

A project's owner may share it with other accounts (`project_shares`, one row per project and account):
their members create jobs in it, and such a job is federated (docs/accounts.md "Sharing a project").
Unsharing deletes the row; the audit trail keeps when it existed."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, ForeignKey, Index, Integer, String, Text, UniqueConstraint, text
from sqlalchemy.orm import Mapped, mapped_column, relationship

from provisioner.store.models import Base, UTCDateTime, new_id, utcnow

PROJECT_LIVE = text("removed_at IS NULL")
DEFAULT_PROJECT_LIVE = text("is_default AND removed_at IS NULL")


class Account(Base):
    __tablename__ = "accounts"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: new_id("acc"))
    name: Mapped[str] = mapped_column(String(63), unique=True)
    # the account created at first start: its admin tokens may create accounts and other accounts' tokens
    root: Mapped[bool] = mapped_column(Boolean, default=False)
    # the account's user namespace range on every node (contracts.jobs.UserNamespace.of_slot); set at
    # creation and never reused (nullable in the store only because revision 0026 fills older rows in place)
    uid_slot: Mapped[int] = mapped_column(Integer, nullable=True, unique=True, index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Project(Base):
    __tablename__ = "projects"
    __table_args__ = (
        Index(
            "uq_projects_account_name_live",
            "account_id",
            "name",
            unique=True,
            sqlite_where=PROJECT_LIVE,
            postgresql_where=PROJECT_LIVE,
        ),
        # one default project per account, enforced by the database too (two workers racing)
        Index(
            "uq_projects_account_default_live",
            "account_id",
            unique=True,
            sqlite_where=DEFAULT_PROJECT_LIVE,
            postgresql_where=DEFAULT_PROJECT_LIVE,
        ),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: new_id("prj"))
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), index=True)
    name: Mapped[str] = mapped_column(String(63))
    # `default` is an SQL keyword: the column is is_default
    default: Mapped[bool] = mapped_column("is_default", Boolean, default=False)
    description: Mapped[str | None] = mapped_column(String(200))
    # minutes a notebook of the project that names no autostop of its own may be idle (0: never);
    # None: contracts.jobspec.NOTEBOOK_AUTOSTOP_MINUTES
    notebook_autostop_minutes: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    removed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    account: Mapped[Account] = relationship(lazy="joined")


class ProjectShare(Base):
    """`project` is shared with `account`: that account's members may create jobs in it."""

    __tablename__ = "project_shares"
    __table_args__ = (UniqueConstraint("project_id", "account_id", name="uq_project_shares_project_account"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: new_id("psh"))
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"), index=True)
    # the account shared with: an index, for "the projects shared with this account" at every job lookup
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), index=True)
    created_by: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    project: Mapped[Project] = relationship(lazy="joined")
    account: Mapped[Account] = relationship(lazy="joined")


class ProjectKey(Base):
    """A third-party key of a project (services/accounts/project_keys.py): `kind` and `name` say what it
    opens (a registry key: `registry` and the registry's host), `key_id` is its public half (a username,
    an access key id), the secret half is sealed and never returned."""

    __tablename__ = "project_keys"
    __table_args__ = (
        UniqueConstraint("project_id", "kind", "name", name="uq_project_keys_project_kind_name"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: new_id("key"))
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(253))
    key_id: Mapped[str] = mapped_column(String(256))
    sealed_secret: Mapped[str] = mapped_column(Text)
    created_by: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)


class ConsoleSessionEnd(Base):
    """A console session signed out before its cookie expires (`until`): refused by every API process,
    also after a restart. Rows past `until` are deleted at the next sign-out."""

    __tablename__ = "console_session_ends"

    sid: Mapped[str] = mapped_column(String(64), primary_key=True)
    until: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
