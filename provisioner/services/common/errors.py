"""Turning database-level refusals into the control plane's errors.

The services check every rule before writing, so these paths only fire when two workers race:
the unique indexes and version columns of the store are then the final word."""

from __future__ import annotations

from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session
from sqlalchemy.orm.exc import StaleDataError

from contracts.errors import Conflict, Unavailable


def changed_meanwhile(what: str) -> Conflict:
    """A row's version moved between this request's read and its write (the ORM's StaleDataError, or a
    Core UPDATE … WHERE version = … that matched nothing)."""
    return Conflict(
        f"{what} was changed by another request at the same time: read it again and retry",
        code="concurrent_update",
    )


def flush(session: Session, what: str) -> None:
    """Flush now so that a race surfaces here as a one-line Conflict naming `what`."""
    try:
        session.flush()
    except StaleDataError as exc:
        raise changed_meanwhile(what) from exc
    except IntegrityError as exc:
        raise Conflict(
            f"{what} conflicts with a change made at the same time: list it again and retry",
            code="concurrent_update",
        ) from exc
    except OperationalError as exc:
        if "locked" in str(exc.orig):
            raise Conflict(
                f"{what} is being changed by another request: retry", code="concurrent_update"
            ) from exc
        raise Unavailable(f"the database refused the change to {what}: check the server log") from exc
