"""Request-scoped dependencies: one database unit of work per request, and the bearer credentials.

`db` commits when the handler returns and rolls back when it raises, BEFORE the response is sent
(scope="function"), so a client never sees success for a change that was not committed.

Units of work are admitted (provisioner/api/admission.py), a bounded number at once. Why: a request's unit
of work holds a pooled connection (and, on SQLite, the write lock) from its first query until the
dependency commits, and between those two it needs the shared worker-thread pool again (a sync handler
after a dependency that queried, then FastAPI's response validation of a sync handler). Without a bound,
a burst fills every worker thread with requests waiting for a connection while the connections are
held by requests waiting for a worker thread: nothing moves until the pool's 30 s timeout answers 500
(a join burst of 200 minions stalled that way). With at most min(pool, threads - reserve)
units of work admitted, each gets its connection and its threads; the rest wait on the event loop,
holding neither."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from contracts.errors import Forbidden
from provisioner.api.admission import admitted as admitted  # for routes running their own unit of work
from provisioner.domain.roles import Action, Role, refuse_scrape_token
from provisioner.domain.roles import Principal as PrincipalValue
from provisioner.services.accounts import accounts
from provisioner.services.common.heartbeat_timing import HeartbeatTiming
from provisioner.store.row_scope import scope_to_account


async def unit_of_work_slot(request: Request) -> AsyncIterator[None]:
    """Hold a unit-of-work slot for the request; for routes that open their own sessions (the console)."""
    async with admitted(request):
        yield


async def _db(
    request: Request, _slot: Annotated[None, Depends(unit_of_work_slot, scope="function")]
) -> AsyncIterator[Session]:
    """Async although the session's work blocks: making a session does no I/O (it connects at its first
    query, in the handler's or a dependency's worker thread), so only the end needs a thread, and it gets
    one hop for commit (or rollback) and close together. As a plain `def` generator FastAPI gave each of
    its two halves a hop of its own, on every operator request."""
    # the slot is taken before the session exists and given back after it is closed (LIFO exit)
    session: Session = request.app.state.sessions()
    try:
        yield session
    except BaseException:
        await run_in_threadpool(_end, session, False)
        raise
    await run_in_threadpool(_end, session, True)


def _end(session: Session, commit: bool) -> None:
    try:
        if commit:
            session.commit()
        else:
            session.rollback()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


Db = Annotated[Session, Depends(_db, scope="function")]


async def _heartbeat_timing(request: Request) -> HeartbeatTiming:
    return request.app.state.runtime.heartbeat


Timing = Annotated[HeartbeatTiming, Depends(_heartbeat_timing)]


# The three bearer credentials, each its own security scheme in the OpenAPI document. auto_error=False:
# the refusal (code, message, 401) stays the services' own (provisioner/api/limits.py words it the same).
OPERATOR_TOKEN = HTTPBearer(
    auto_error=False, scheme_name="operatorToken", description="operator token (`provision token`)"
)
NODE_CREDENTIAL = HTTPBearer(
    auto_error=False, scheme_name="nodeCredential", description="node credential issued at a join"
)
JOIN_TOKEN = HTTPBearer(
    auto_error=False, scheme_name="joinToken", description="the region join token that started the join"
)
Credentials = HTTPAuthorizationCredentials | None

# Dependencies that only read the request are `async def`: FastAPI runs a plain `def` dependency in the
# worker-thread pool, and each such hop costs an operator request a thread switch. Those that query the
# store stay `def`: their I/O blocks.


def _value(credentials: Credentials) -> str | None:
    return credentials.credentials if credentials else None  # HTTPBearer gives None for an empty one


async def _operator_token(credentials: Annotated[Credentials, Depends(OPERATOR_TOKEN)]) -> str | None:
    return _value(credentials)


async def _node_credential(credentials: Annotated[Credentials, Depends(NODE_CREDENTIAL)]) -> str | None:
    return _value(credentials)


async def _join_token(credentials: Annotated[Credentials, Depends(JOIN_TOKEN)]) -> str | None:
    return _value(credentials)


NodeCredential = Annotated[str | None, Depends(_node_credential)]
JoinToken = Annotated[str | None, Depends(_join_token)]


def require_principal(
    request: Request, session: Db, token: Annotated[str | None, Depends(_operator_token)]
) -> PrincipalValue:
    """Who the operator token is: actor, account and role (services/accounts/accounts.py), or 401. FastAPI
    runs
    it once per request, however many dependencies ask for it."""
    principal = accounts.principal_of(session, token)
    refuse_scrape_token(principal.role)
    request.state.actor = principal.actor
    return principal


async def require_operator(principal: Annotated[PrincipalValue, Depends(require_principal)]) -> str:
    """The audit-trail actor (`operator:<token name>`) or 401. Applied to every operator router in
    the app factory; minion routes (join, heartbeat) use node credentials instead."""
    return principal.actor


def require_scraper(session: Db, token: Annotated[str | None, Depends(_operator_token)]) -> PrincipalValue:
    """GET /metrics: a scrape token (role `scrape`), or an admin token of the root account; 401 or 403."""
    principal = accounts.principal_of(session, token)
    if principal.role != Role.SCRAPE and not principal.is_fleet_admin:
        raise Forbidden(
            "GET /metrics needs a scrape token (`provision token create NAME --role scrape`) or an admin "
            "token of the root account",
            code="forbidden_role",
        )
    return principal


Scraper = Annotated[PrincipalValue, Depends(require_scraper)]
Operator = Annotated[str, Depends(require_operator)]
# account-scoped routes (projects, jobs, tokens): the caller's account and role
Principal = Annotated[PrincipalValue, Depends(require_principal)]


# What only reads: a region's members may do it; anything else is its admins' (Action.MANAGE_FLEET).
READS = frozenset({"GET", "HEAD", "OPTIONS"})


def enter_fleet(session: Session, principal: PrincipalValue, *, changes: bool) -> None:
    """A unit of work on the fleet (regions and what is in them) as `principal`: it sees only its own
    account's regions (every region for a root admin; store/row_scope.py), and a change needs an admin.
    The API's fleet routes and the console's fleet actions both enter here."""
    scope_to_account(session, principal.account_scope())
    if changes:
        principal.require(Action.MANAGE_FLEET)


def fleet_principal(request: Request, session: Db, principal: Principal) -> PrincipalValue:
    """The caller of a fleet route: applied to every fleet router in the app factory."""
    enter_fleet(session, principal, changes=request.method not in READS)
    return principal


def trust_principal(principal: Principal) -> PrincipalValue:
    """The caller of a trust-root route (TPM vendor CAs, image-builder keys, providers, rejections): an
    admin of the root account, since what it trusts or spends holds for every account's regions."""
    principal.require(Action.MANAGE_TRUST)
    return principal


FleetScope = Depends(fleet_principal)
TrustRoot = Depends(trust_principal)
