"""Heartbeats (POST /v1/nodes/{id}/heartbeat, node credential auth): the node reports its actual state
and gets its desired state back; every K-th beat the response carries a nonce and the next beat must
carry a fresh quote over it (continuous attestation). A quote that fails — a changed PCR, a quote not
made by the AK recorded at join — moves the node to errored with the refusal's message."""

from __future__ import annotations

import base64
from datetime import datetime, timezone
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session

from provisioner.attestation.continuous import issue_quote_nonce, quote_due, verify_fresh_quote
from provisioner.attestation.refusals import Refusal
from provisioner.attestation.wire import QuoteMessage
from provisioner.services import audit, desired_state, node_address
from provisioner.services import join as join_service
from provisioner.services import nodes as node_service
from provisioner.reconcilers.loop import kick_after_commit
from provisioner.states import NodeState, RegionState


class HeartbeatIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int = 1
    actual: dict[str, Any] = Field(default_factory=dict)
    quote: QuoteMessage | None = None
    inventory: dict[str, Any] | None = None
    requirements: dict[str, Any] | None = None


@desired_state.contributes("maintenance")
def _maintenance(session: Session, node: Any) -> bool:
    """The node should hold no jobs unless an operator activated it."""
    return node.state != NodeState.ACTIVE


def beat(session: Session, node_id: str, credential: str | None, body: HeartbeatIn, *,
         observed_address: str | None = None) -> dict[str, Any]:
    """`observed_address`: where this beat came from (the finalize playbook's SSH host without a hostname)."""
    node, att = join_service.node_for_credential(session, node_id, credential)
    now = datetime.now(timezone.utc)
    node_service.record_report(session, node, at=now, inventory=body.inventory, requirements=body.requirements)
    node_address.record(node, observed_address)
    att.heartbeats += 1
    issuer = join_service._issuer(session)
    actor = f"minion:{node.minion_id}"
    if body.quote is not None and att.quote_nonce:
        policy = join_service.pcr_policy_for(session, node.region, att.pcr_record)
        result = verify_fresh_quote(issuer, node.id, att.ak_public, bytes.fromhex(att.quote_nonce),
                                    body.quote.evidence(), policy)
        att.quote_nonce = None
        if isinstance(result, Refusal):
            reason = f"continuous attestation: {result.message}"
            audit.record(session, kind="join", resource_id=node.minion_id, name=node.name, actor=actor,
                         from_state=None, to_state="refused", reason=f"{result.code.value}: {result.message}")
            if node.state not in (NodeState.ERRORED, NodeState.REMOVED):
                node_service.transition(session, node, NodeState.ERRORED, actor=actor, reason=reason)
        else:
            att.last_quote_at = now
    quote_nonce = None
    if (att.quote_nonce is None or body.quote is None) and quote_due(att.heartbeats, join_service.quote_every()):
        record = issue_quote_nonce(issuer, node.id)
        att.quote_nonce = record.nonce.hex()
        quote_nonce = base64.b64encode(record.nonce).decode()
    if node.region.state != RegionState.HEALTHY:
        kick_after_commit(session, "region-health")  # a first report makes the region healthy now, not at the next pass
    desired_state.record_actual(session, node, body.actual)
    session.flush()
    return {"node_id": node.id, "state": node.state, "reason": node.reason,
            "desired": desired_state.desired_for(session, node), "quote_nonce": quote_nonce,
            "heartbeat_interval_s": join_service.heartbeat_interval_s()}
