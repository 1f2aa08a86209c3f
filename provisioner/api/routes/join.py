"""Minion routes (no operator token): POST /v1/join and its proof authenticate with the region join
token; heartbeats with the node credential issued at a successful join (never the join token)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Request, Response
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from contracts.messages import HeartbeatRequest, HeartbeatResponse, JoinChallenge, KeyJoinChallenge
from provisioner.api.admission import beat_admitted
from provisioner.api.deps import NODE_CREDENTIAL, Credentials, Db, JoinToken, Timing
from provisioner.api.errors import JOIN_ERRORS, NODE_ERRORS, PROOF_ERRORS
from provisioner.api.lean_route import LeanRoute
from provisioner.domain.states import JoinOutcome
from provisioner.services import beat as heartbeat_service
from provisioner.services.common.heartbeat_timing import HeartbeatTiming
from provisioner.services.fleet import join as service

router = APIRouter(tags=["join"])


@router.post(
    "/v1/join",
    status_code=201,
    response_model=JoinChallenge | KeyJoinChallenge,
    responses=JOIN_ERRORS,
)
def join(session: Db, body: Any = Body(...)) -> Response:
    """Step 1 (docs/join-protocol.md): JoinRequest → JoinChallenge, or 403 with the refusal; a device
    without a TPM sends a KeyJoinRequest (its `device_key`) and gets a KeyJoinChallenge.
    No Authorization header: the join token travels in the body (`join_token`), checked here."""
    challenge = service.begin(session, body)
    return Response(challenge.model_dump_json(), status_code=201, media_type="application/json")


@router.post("/v1/join/{join_id}/proof", responses=PROOF_ERRORS)
def proof(
    join_id: str,
    request: Request,
    response: Response,
    session: Db,
    timing: Timing,
    token: JoinToken,
    body: Any = Body(...),
) -> dict[str, Any]:
    """Step 2: ProofRequest (KeyProofRequest after a KeyJoinChallenge), with `Authorization: Bearer <join
    token>` → the node credential (200), or `pending` (202) while no operator has added this minion_id."""
    result = service.finish(
        session,
        join_id,
        token,
        body,
        observed_address=request.client.host if request.client else None,
        timing=timing,
    )
    if result.state == JoinOutcome.PENDING:
        response.status_code = 202
    return result.model_dump(mode="json")


# The hottest route (a fleet beats every 30 s), so one hop to the thread pool per beat: the unit of work
# (`_beat`: a session committed, or rolled back, and closed as the `Db` dependency does) runs there whole,
# the credential comes straight from the async bearer scheme and the timing from the app's runtime.
# Through the sync `Db`, `NodeCredential` and `Timing` dependencies and a sync handler a beat took five
# hops. Same security scheme, same values, same parameters in the OpenAPI operation.
# The answer is serialised once, in that hop, from its model (as the join's challenge is): returned as a
# dict, FastAPI validated it again against the return annotation and encoded it on the event loop.
async def heartbeat(
    node_id: str,
    body: HeartbeatRequest,
    request: Request,
    bearer: Annotated[Credentials, Depends(NODE_CREDENTIAL)],
) -> Response:
    """Actual state in, desired state (and, every K beats, a quote nonce) out."""
    async with beat_admitted(request):  # a few beats at once, within what the pool and threads carry
        answer = await run_in_threadpool(
            _beat,
            request.app.state.sessions,
            node_id,
            bearer.credentials if bearer else None,
            body,
            request.client.host if request.client else None,
            request.app.state.runtime.heartbeat,
        )
    return Response(answer, media_type="application/json")


router.add_api_route(
    "/v1/nodes/{node_id}/heartbeat",
    heartbeat,
    methods=["POST"],
    response_model=HeartbeatResponse,
    responses=NODE_ERRORS,
    route_class_override=LeanRoute,
)


def _beat(
    sessions: sessionmaker[Session],
    node_id: str,
    credential: str | None,
    body: HeartbeatRequest,
    observed_address: str | None,
    timing: HeartbeatTiming,
) -> bytes:
    with sessions.begin() as session:
        answer = heartbeat_service.beat(
            session, node_id, credential, body, observed_address=observed_address, timing=timing
        )
    return answer.model_dump_json().encode()
