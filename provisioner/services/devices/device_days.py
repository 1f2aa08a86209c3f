"""Device-days: how many devices an account had on a day, what the device fee is to be charged on (issue
15; the billing ledger's device fee reads them, see docs/devices.md "Devices in the control plane").

A device counts on a UTC day when it existed at any time that day: added before the day ended and not
removed before it began. A device added and removed within one day counts for that day; one added on
Monday and removed on Wednesday counts on Monday, Tuesday and Wednesday; one errored, or waiting for its
minion, still counts (the operator configured it). Its account is its region's (`regions.account_id`); a
device in a region without an account counts for nobody.

Nothing is written: the answer is derived from the node rows (`service`, `created_at`) and the removal
line of the audit trail, which are never deleted, so any past day can be asked again and gives the same
number. Devices are counted by node id: a device removed and added again is a new node, so on the day
both existed it counts twice."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session
from sqlalchemy.sql import Select

from provisioner.domain.states import NodeState, Service
from provisioner.services.fleet import nodes as node_service
from provisioner.store.models import AuditEvent, Node, Region


def day_bounds(day: date) -> tuple[datetime, datetime]:
    """The UTC day as [start, end)."""
    start = datetime.combine(day, time.min, tzinfo=UTC)
    return start, start + timedelta(days=1)


def _removed_at() -> Select[datetime]:
    """When the node of the outer query was removed (its first removal line), as a correlated scalar."""
    return (
        select(func.min(AuditEvent.at))
        .where(
            AuditEvent.resource_kind == node_service.KIND,
            AuditEvent.resource_id == Node.id,
            AuditEvent.to_state == NodeState.REMOVED.value,
        )
        .correlate(Node)
    )


def _on(account_id: str, day: date) -> Select[str]:
    start, end = day_bounds(day)
    removed_at = _removed_at().scalar_subquery()
    return (
        select(Node.id)
        .join(Region, Region.id == Node.region_id)
        .where(
            Region.account_id == account_id,
            Node.service == Service.DEVICE.value,
            Node.created_at < end,
            (removed_at.is_(None)) | (removed_at >= start),
        )
    )


def device_ids_on(session: Session, account_id: str, day: date) -> list[str]:
    """The ids of the devices `account_id` had on `day`, sorted (what a per-device-day entry keys on)."""
    return sorted(session.scalars(_on(account_id, day)))


def devices_on(session: Session, account_id: str, day: date) -> int:
    """How many distinct devices `account_id` had on the UTC day `day` (see the module's rule)."""
    return int(session.scalar(select(func.count()).select_from(_on(account_id, day).subquery())) or 0)


def intervals_by_account(session: Session) -> dict[str, list[tuple[datetime, datetime | None]]]:
    """Every account's devices as (added_at, removed_at or None) in one query: what the daily device fee
    walks day by day (services/devices/device_fees.py) without a query per account and day. Same rule as
    `_on`."""
    removed_at = _removed_at().scalar_subquery()
    rows = session.execute(
        select(Region.account_id, Node.created_at, removed_at)
        .join(Region, Region.id == Node.region_id)
        .where(Region.account_id.is_not(None), Node.service == Service.DEVICE.value)
    )
    out: dict[str, list[tuple[datetime, datetime | None]]] = {}
    for account_id, added, removed in rows:
        if account_id is not None:  # the query's filter; mypy cannot see it
            out.setdefault(account_id, []).append((added, removed))
    return out
