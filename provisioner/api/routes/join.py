"""Minion routes (no operator token): POST /v1/join and its proof authenticate with the region join
token; heartbeats with the node credential issued at a successful join (never the join token)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Request, Response

from contracts.messages import HeartbeatRequest, JoinChallenge
from provisioner.api.deps import Db, JoinToken, NodeCredential, Timing
from provisioner.api.errors import JOIN_ERRORS, NODE_ERRORS, PROOF_ERRORS
from provisioner.domain.states import JoinOutcome
from provisioner.services import heartbeat as heartbeat_service
from provisioner.services import join as service

router = APIRouter(tags=["join"])


@router.post("/v1/join", status_code=201, response_model=JoinChallenge, responses=JOIN_ERRORS)
def join(session: Db, body: Any = Body(...)) -> Response:
    """Step 1 (docs/join-protocol.md): JoinRequest → JoinChallenge, or 403 with the refusal.
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
    """Step 2: ProofRequest (with `Authorization: Bearer <join token>`) → the node credential (200),
    or `pending` (202) while no operator has added this minion_id."""
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


@router.post("/v1/nodes/{node_id}/heartbeat", responses=NODE_ERRORS)
def heartbeat(
    node_id: str,
    body: HeartbeatRequest,
    request: Request,
    session: Db,
    timing: Timing,
    credential: NodeCredential,
) -> dict[str, Any]:
    """Actual state in, desired state (and, every K beats, a quote nonce) out."""
    return heartbeat_service.beat(
        session,
        node_id,
        credential,
        body,
        observed_address=request.client.host if request.client else None,
        timing=timing,
    )
