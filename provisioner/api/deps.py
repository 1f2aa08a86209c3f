"""Request-scoped dependencies: one database unit of work per request, and operator auth.

`db` commits when the handler returns and rolls back when it raises, BEFORE the response is sent
(scope="function"), so a client never sees success for a change that was not committed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from provisioner.services import tokens
from provisioner.services.heartbeat_timing import HeartbeatTiming


def _db(request: Request) -> Iterator[Session]:
    session: Session = request.app.state.sessions()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


Db = Annotated[Session, Depends(_db, scope="function")]


def _heartbeat_timing(request: Request) -> HeartbeatTiming:
    return request.app.state.runtime.heartbeat


Timing = Annotated[HeartbeatTiming, Depends(_heartbeat_timing)]


def bearer_token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def require_operator(request: Request, session: Db) -> str:
    """The audit-trail actor (`operator:<token name>`) or 401. Applied to every operator router in
    the app factory; minion routes (join, heartbeat) use node credentials instead."""
    token = tokens.authenticate(session, bearer_token(request))
    actor = f"operator:{token.name}"
    request.state.actor = actor
    return actor


Operator = Annotated[str, Depends(require_operator)]
