"""Node credentials: the bearer secret a node gets at the end of its join and sends with every heartbeat.
Only its SHA-256 is stored (NodeAttestation.credential_sha256); a retry or re-add forgets it."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Select, bindparam, select
from sqlalchemy.orm import Session

from contracts.errors import NotFound, Unauthorized
from provisioner.domain.states import NodeState
from provisioner.store.join_models import NodeAttestation
from provisioner.store.models import Node

PREFIX = "rbn_"  # rigbase node credential


def new_credential() -> str:
    return PREFIX + secrets.token_urlsafe(32)


def digest(credential: str) -> str:
    return hashlib.sha256(credential.encode()).hexdigest()


def holder_statement(*facts: Any) -> Select[Any]:
    """The attestation holding a credential (bound parameter `credential_sha256`) and its node, and
    `facts` about them (columns, e.g. a correlated EXISTS on Node.id). Build it once: every heartbeat starts
    with it, and building and keying a statement per beat cost more than running it."""
    return (
        select(NodeAttestation, Node, *facts)
        .outerjoin(Node, Node.id == NodeAttestation.node_id)
        .where(NodeAttestation.credential_sha256 == bindparam("credential_sha256"))
    )


_HOLDER = holder_statement()


def _holder(session: Session, credential: str | None, statement: Select[Any] = _HOLDER) -> Sequence[Any]:
    """The attestation holding this credential, its node (region and provider eagerly joined, as
    Node.region and Region.provider say) and the statement's facts, in one query."""
    if not credential:
        raise Unauthorized("no node credential: join first (`minion join`)", code="credential_missing")
    row: Sequence[Any] | None = session.execute(statement, {"credential_sha256": digest(credential)}).first()
    if row is None:
        raise Unauthorized(
            "the node credential is not valid (the node was retried, removed or re-added): join again",
            code="credential_invalid",
        )
    return row


def _live(node: Node | None) -> Node:
    if node is None or node.state == NodeState.REMOVED:
        raise NotFound(
            "this node was removed: ask the operator to add it again, then join", code="node_not_found"
        )
    return node


def any_node(session: Session, credential: str | None) -> Node:
    """The live node this credential belongs to, whichever it is (a download any node may make: the
    playbook bundle), or Unauthorized/NotFound as node_for_credential refuses."""
    return _live(_holder(session, credential)[1])


def node_for_credential(
    session: Session, node_id: str, credential: str | None
) -> tuple[Node, NodeAttestation]:
    node, att, _ = node_and_facts(session, node_id, credential, _HOLDER)
    return node, att


def node_and_facts(
    session: Session, node_id: str, credential: str | None, statement: Select[Any]
) -> tuple[Node, NodeAttestation, tuple[Any, ...]]:
    """As node_for_credential, with the values of the facts `statement` (a holder_statement) asks."""
    row = _holder(session, credential, statement)
    att, node = row[0], row[1]
    if att.node_id != node_id:
        raise Unauthorized(
            "the node credential is not valid (the node was retried, removed or re-added): join again",
            code="credential_invalid",
        )
    return _live(node), att, tuple(row[2:])
