"""Heartbeats (POST /v1/nodes/{id}/heartbeat, node credential auth): the node reports its actual state
and gets its desired state back; every K-th beat the response carries a nonce and the next beat must
carry a fresh quote over it (continuous attestation). A quote that fails — a changed PCR, a quote not
made by the AK recorded at join, an event log that does not replay to its PCR 4 or names an EFI
application no registered manifest has — moves the node to errored with the refusal's message, and so
does a request left unanswered for `HeartbeatTiming.quote_grace_beats` beats: ignoring the nonce must
not keep a node in service. A device that joined with a device key (no TPM) answers the nonce with a
signature by that key instead (contracts/device_key.py): the same schedule, grace and refusal, proving
only that the key is still on the device. A quote is also asked for whenever the last verified one (or
the join) is older than `HeartbeatTiming.quote_max_age_s`, so a node is never trusted on an old quote
alone."""

from __future__ import annotations

import base64
import functools
import hashlib
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pydantic_core
from sqlalchemy import Select
from sqlalchemy.orm import Session, defaultload

from contracts.messages import HeartbeatRequest, HeartbeatResponse
from provisioner.attestation.continuous import issue_quote_nonce, quote_due, verify_fresh_quote
from provisioner.attestation.device_key import verify_fresh_signature
from provisioner.attestation.nonces import LateAnswer
from provisioner.attestation.quote import VerifiedQuote
from provisioner.attestation.refusals import Refusal
from provisioner.attestation.wire import quote_evidence
from provisioner.domain.states import NODE_STOPPED, JoinOutcome, MinionIdentity, NodeState, RegionState
from provisioner.services.common import audit, desired_state
from provisioner.services.common.desired_state import HeartbeatKeys
from provisioner.services.common.heartbeat_timing import HeartbeatTiming
from provisioner.services.common.wakeups import Wake, wake_after_commit
from provisioner.services.fleet import images, node_address, node_credentials, nonce_store
from provisioner.services.fleet import join as join_service
from provisioner.services.fleet import nodes as node_service
from provisioner.store.join_models import NodeAttestation
from provisioner.store.models import Node, Region

log = logging.getLogger("rigbase.heartbeat")


def maintenance_for_node(session: Session, node: Any) -> bool:
    """The node should hold no jobs unless an operator activated it."""
    return node.state != NodeState.ACTIVE


def beat(
    session: Session,
    node_id: str,
    credential: str | None,
    body: HeartbeatRequest,
    *,
    observed_address: str | None = None,
    keys: HeartbeatKeys,
    timing: HeartbeatTiming = HeartbeatTiming(),
) -> HeartbeatResponse:
    """`keys`: what each heartbeat key contributes and records (provisioner/services/beat.py lists them).
    `observed_address`: where this beat came from (provisioner/services/fleet/node_address.py).

    The quote is checked before anything the beat reports is stored: a beat whose quote is refused
    records only the refusal (the audit line, the node errored, the nonce spent), not its inventory,
    requirements, actual state, address, beat count or heartbeat time, so a forged quote can neither
    keep a node online nor rewrite what it claims to have."""
    with desired_state.one_beat(session):
        return _beat(
            session, node_id, credential, body, keys, observed_address=observed_address, timing=timing
        )


def _beat(
    session: Session,
    node_id: str,
    credential: str | None,
    body: HeartbeatRequest,
    keys: HeartbeatKeys,
    *,
    observed_address: str | None,
    timing: HeartbeatTiming,
) -> HeartbeatResponse:
    statement, reads = _holder_with_reads(keys)
    node, att, could_find = node_credentials.node_and_facts(session, node_id, credential, statement)
    desired_state.record_nothing_to_read(
        session, (r for r, found in zip(reads, could_find, strict=True) if not found)
    )
    now = datetime.now(UTC)
    if not _quote_passes(session, node, att, body, now=now):
        session.flush()
        return _answer(session, node, keys, None, timing, body.desired_revision)
    # the report, the beat's count and the observed address in one write of the node's row: a steady beat
    # writes nothing else
    inventory = node_address.inventory_to_store(node, body.inventory, observed_address)
    node_service.record_beat(session, node, at=now, inventory=inventory, requirements=body.requirements)
    _enforce_quote_grace(session, node, att, timing=timing)
    quote_nonce = _ask_for_quote(session, node, att, now=now, timing=timing)
    if node.region.state != RegionState.HEALTHY:
        # a first report makes the region healthy now, not at the next pass
        wake_after_commit(session, Wake.REGION_HEALTH)
    keys.record_actual(session, node, body.actual)
    session.flush()
    return _answer(session, node, keys, quote_nonce, timing, body.desired_revision)


@functools.cache
def _holder_with_reads(keys: HeartbeatKeys) -> tuple[Select[Any], tuple[str, ...]]:
    """The beat's first query: the credential's node and attestation, and for each of the beat's skippable
    reads (`keys.skippable_reads`) whether it could find anything. Built once per set of keys."""
    reads = tuple(keys.skippable_reads)
    facts = [keys.skippable_reads[r](Node.id).label(f"could_find_{i}") for i, r in enumerate(reads)]
    # no beat reads the region's provider (its kind, its config): not joined, loaded if one ever does
    statement = node_credentials.holder_statement(*facts).options(
        defaultload(Node.region).lazyload(Region.provider)
    )
    return statement, reads


def _answer(
    session: Session,
    node: Node,
    keys: HeartbeatKeys,
    quote_nonce: str | None,
    timing: HeartbeatTiming,
    held: str | None,
) -> HeartbeatResponse:
    """`held`: the revision of the desired state the minion says it holds; the same one is not sent again."""
    desired = keys.desired_for(session, node)
    revision = desired_revision(desired)
    return HeartbeatResponse(
        node_id=node.id,
        state=node.state,
        reason=node.reason,
        desired=None if revision == held else desired,
        quote_nonce=quote_nonce,
        heartbeat_interval_s=timing.interval_s,
        desired_revision=revision,
    )


def desired_revision(desired: dict[str, Any]) -> str:
    """A name for this desired state: the digest of its JSON (a value the node must see again, a job's
    secret included, changes it). The state is still built every beat, so a change anywhere reaches the
    node at its next beat; what a steady beat saves is its encoding and its bytes on the wire."""
    return hashlib.blake2b(pydantic_core.to_json(desired), digest_size=16).hexdigest()


def _quote_passes(
    session: Session, node: Node, att: NodeAttestation, body: HeartbeatRequest, *, now: datetime
) -> bool:
    """Check the quote this beat carries against the outstanding nonce (False: refused, and the node is
    errored). A beat without a quote, or with one nobody asked for, passes: it proves nothing, and the
    grace count (_enforce_quote_grace) catches a node that never answers. A late answer (its nonce expired
    on the way, provisioner/attestation/continuous.py) passes as a beat without one."""
    keyed = att.identity == MinionIdentity.DEVICE_KEY
    if (body.key_signature if keyed else body.quote) is None or not att.quote_nonce:
        return True
    actor = f"minion:{node.minion_id}"
    result = (
        _verify_key_signature(session, node, att, body) if keyed else _verify_quote(session, node, att, body)
    )
    att.quote_nonce = None
    if isinstance(result, LateAnswer):
        # proof of nothing, now or against the node: this beat's answer asks again (quote_asked_beat
        # stays, so _ask_for_quote does) and the grace keeps counting from the first request
        log.warning("node %s answered its quote request late (%s): asked again", node.name, result.detail)
        return True
    att.quote_asked_beat = None
    if not isinstance(result, Refusal):
        att.last_quote_at = now
        return True
    audit.record(
        session,
        kind="join",
        resource_id=node.minion_id,
        name=node.name,
        actor=actor,
        from_state=None,
        to_state=JoinOutcome.REFUSED.value,
        reason=f"{result.code.value}: {result.heartbeat_message}",
    )
    _error(session, node, f"continuous attestation: {result.heartbeat_message}", actor=actor)
    return False


def _verify_quote(
    session: Session, node: Node, att: NodeAttestation, body: HeartbeatRequest
) -> VerifiedQuote | Refusal | LateAnswer:
    assert body.quote is not None and att.quote_nonce is not None  # _quote_passes checked both
    return verify_fresh_quote(
        nonce_store.issuer(session),
        node.id,
        att.ak_public,
        bytes.fromhex(att.quote_nonce),
        quote_evidence(body.quote),
        join_service.pcr_policy_for(session, node.region, att.pcr_record),
        boot=images.boot_path_policy_for(session, node.region),
    )


def _verify_key_signature(
    session: Session, node: Node, att: NodeAttestation, body: HeartbeatRequest
) -> Refusal | LateAnswer | None:
    assert body.key_signature is not None and att.quote_nonce is not None  # _quote_passes checked both
    return verify_fresh_signature(
        nonce_store.issuer(session),
        node.id,
        att.ak_public,
        bytes.fromhex(att.quote_nonce),
        body.key_signature,
    )


def _enforce_quote_grace(
    session: Session, node: Node, att: NodeAttestation, *, timing: HeartbeatTiming
) -> None:
    """A quote request the node let `timing.quote_grace_beats` beats pass unanswered (or answered only
    late, after each nonce expired): errored."""
    actor = f"minion:{node.minion_id}"
    asked = att.quote_asked_beat
    if asked is None or node.heartbeats - asked < timing.quote_grace_beats:
        return
    att.quote_nonce = None
    att.quote_asked_beat = None
    last = att.last_quote_at.isoformat(timespec="seconds") if att.last_quote_at else "never since the join"
    _error(
        session,
        node,
        f"no quote answered within {timing.quote_grace_beats} heartbeats of the request (last verified "
        f"quote: {last}); provision node retry {node.name} after checking the node",
        actor=actor,
    )


def _error(session: Session, node: Node, reason: str, *, actor: str) -> None:
    if node.state not in NODE_STOPPED:
        node_service.transition(session, node, NodeState.ERRORED, actor=actor, reason=reason)


def _ask_for_quote(
    session: Session, node: Node, att: NodeAttestation, *, now: datetime, timing: HeartbeatTiming
) -> str | None:
    """The nonce (base64) this beat's answer carries, if any. While a request is unanswered every beat
    carries a fresh nonce (the node may have lost an answer) but the grace counts from the first one."""
    if node.state in NODE_STOPPED:
        return None
    last_proof = max(t for t in (att.last_quote_at, att.attested_at) if t is not None)
    stale = now - last_proof > timedelta(seconds=timing.quote_max_age_s)
    if att.quote_asked_beat is None and not (quote_due(node.heartbeats, timing.quote_every) or stale):
        return None
    record = issue_quote_nonce(nonce_store.issuer(session), node.id)
    att.quote_nonce = record.nonce.hex()
    if att.quote_asked_beat is None:
        att.quote_asked_beat = node.heartbeats
    return base64.b64encode(record.nonce).decode()
