"""Row scope: the fleet rows one account's unit of work sees, as PostgreSQL's row security would filter them.

A fleet route (regions and everything in them) runs its unit of work scoped to the caller's account
(`scope_to_account`): every ORM statement of that session, however deep in the services it is written,
gets SQLAlchemy's `with_loader_criteria` for the models below, so another account's region, node,
datastore, reservation, join token, pending minion, image manifest or device configuration is not there:
a lookup answers the same 404 as a missing row, a list leaves it out, and an ambiguous name is never
ambiguous because of a row the caller cannot see. A session with no scope (the root account's admins,
the reconcilers, the minions' routes) sees every row.

What the caller may change among the rows it sees is the role's business (provisioner/domain/roles.py).
A statement that must look past the scope to keep a fleet-wide rule (one live node per minion_id) says
so with `.execution_options(**UNSCOPED)` and never shows the caller what it found."""

from __future__ import annotations

from typing import Any, Final

from sqlalchemy import event, select
from sqlalchemy.orm import ORMExecuteState, Session, with_loader_criteria

from provisioner.store.device_models import DeviceConfig
from provisioner.store.gcp_models import GcpBurstVm, GcpQuotaCache, GcpStorageNode
from provisioner.store.image_models import RegisteredManifest
from provisioner.store.join_models import JoinAttempt, JoinToken, PendingMinion
from provisioner.store.models import Node, Region
from provisioner.store.regional_models import Datastore, Reservation

_KEY: Final = "rigbase.scope_account"
UNSCOPED: Final[dict[str, Any]] = {"rigbase_unscoped": True}

# the models that live in a region (each has region_id); Region itself is scoped by its account_id
REGIONAL: Final = (
    Node,
    Reservation,
    Datastore,
    JoinToken,
    JoinAttempt,
    PendingMinion,
    RegisteredManifest,
    DeviceConfig,
    GcpStorageNode,
    GcpBurstVm,
    GcpQuotaCache,
)


def scope_to_account(session: Session, account_id: str | None) -> None:
    """From now on this session sees only `account_id`'s regions and what is in them (None: everything)."""
    if account_id is None:
        session.info.pop(_KEY, None)
    else:
        session.info[_KEY] = account_id


def scoped_account(session: Session) -> str | None:
    return session.info.get(_KEY)


def sees(session: Session, region_account_id: str | None) -> bool:
    """Whether this session's scope includes a region of that account (for a row found with UNSCOPED)."""
    account_id = scoped_account(session)
    return account_id is None or region_account_id == account_id


def seen_minion_ids(session: Session) -> Any:
    """For an audit query keyed by minion_id (join refusals): the ids of the minions that reached, or are
    held in, the scope's regions (None: no scope, every id). Those selects get the scope when run."""
    if scoped_account(session) is None:
        return None
    return select(PendingMinion.minion_id).union(select(Node.minion_id), select(JoinAttempt.minion_id))


@event.listens_for(Session, "do_orm_execute")
def _filter(state: ORMExecuteState) -> None:
    account_id = state.session.info.get(_KEY)
    if account_id is None or state.execution_options.get("rigbase_unscoped"):
        return
    if not (state.is_select or state.is_update or state.is_delete):
        return
    owned = select(Region.id).where(Region.account_id == account_id).scalar_subquery()
    options = [with_loader_criteria(Region, Region.account_id == account_id, include_aliases=True)]
    options += [
        with_loader_criteria(model, model.region_id.in_(owned), include_aliases=True) for model in REGIONAL
    ]
    state.statement = state.statement.options(*options)
