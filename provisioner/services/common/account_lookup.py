"""The root account: created at first start (revision 0014, in every store), the owner of the first admin
token and of what is created without an account. A module of its own, below tokens, regions and
accounts, so each can find it without importing the others."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from contracts.errors import Unavailable
from provisioner.store.account_models import Account


def root_account(session: Session) -> Account:
    row = session.scalar(select(Account).where(Account.root.is_(True)).order_by(Account.created_at))
    if row is None:  # the migration creates it; a store without one was not migrated by rigbase
        raise Unavailable("the store has no root account: start `provision serve` once to migrate it")
    return row
