"""The attested join as the control plane runs it over HTTP (docs/join-protocol.md): the transport-free
verifier in provisioner/attestation/ plus what only the store knows — join tokens, trusted vendor CAs,
which node (if any) an operator added for the minion, pinned EKs, PCR baselines, pending minions.

Refusals: every one is written to the audit trail (kind `join`, resource = minion_id, and in the node's
own history when a node exists) and COMMITTED before the error is raised, because the request's unit
of work rolls back on errors — and the nonce a refused proof spent must stay spent."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn, TypeVar

from cryptography.hazmat.primitives import serialization
from pydantic import BaseModel, ValidationError
from sqlalchemy import delete
from sqlalchemy.orm import Session

from contracts.errors import Conflict, Unauthorized, plain_validation_message
from contracts.messages import (
    JoinChallenge,
    JoinRequest,
    JoinResult,
    KeyJoinChallenge,
    KeyJoinRequest,
    KeyProofRequest,
    ProofRequest,
)
from provisioner.attestation.device_key import KeyAttested, KeyJoinVerifier
from provisioner.attestation.keys import public_key, spki_der
from provisioner.attestation.pcr_policy import PcrPolicy, RecordPolicy
from provisioner.attestation.refusals import Refusal, RefusalCode, refuse
from provisioner.attestation.tpm_structures import MalformedStructure, parse_public
from provisioner.attestation.verifier import Attested, JoinVerifier, RegionTrust
from provisioner.attestation.wire import PendingJoin, PendingKeyJoin, pending_from_json
from provisioner.domain.hardware_text import failed_rules
from provisioner.domain.states import (
    NODE_AWAITING_MINION,
    NODE_STOPPED,
    JoinOutcome,
    MinionIdentity,
    NodeState,
    Service,
)
from provisioner.services.common import audit
from provisioner.services.common.heartbeat_timing import HeartbeatTiming
from provisioner.services.common.wakeups import Wake, wake_after_commit
from provisioner.services.fleet import (
    device_join,
    images,
    join_tokens,
    node_address,
    node_credentials,
    nonce_store,
    tpm_cas,
)
from provisioner.services.fleet import nodes as node_service
from provisioner.services.fleet.nonce_store import DbNonceStore
from provisioner.store.join_models import JoinAttempt, NodeAttestation, PendingMinion
from provisioner.store.models import Node, Region

_Body = TypeVar("_Body", bound=BaseModel)

# Region setting (Region.settings) that lets EKs without a vendor certificate join (operator opt-in).
ALLOW_EK_WITHOUT_CERT = "allow_ek_without_certificate"
# Region setting that lets devices without a TPM join with a device key (operator opt-in,
# docs/join-protocol.md "Devices without a TPM").
ALLOW_DEVICES_WITHOUT_TPM = "allow_devices_without_tpm"
# Proof refusals that anyone can cause — a slow network, replayed traffic, or someone who knows the
# node's (public) EK but not its TPM and so cannot activate the credential — never error the node:
# they are audited and the minion starts over. Every other proof refusal comes from the node's own TPM
# (a bad quote, changed PCRs) and moves it to errored.
TRANSIENT = {
    RefusalCode.nonce_unknown,
    RefusalCode.nonce_replayed,
    RefusalCode.nonce_expired,
    RefusalCode.nonce_mismatch,
    RefusalCode.wrong_secret,
    RefusalCode.device_key_signature_invalid,
}
JOIN_ATTEMPT_TTL = timedelta(minutes=10)


def _now() -> datetime:
    return datetime.now(UTC)


def _sha(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


# ---------------------------------------------------------------- PCR policy hook


def pcr_policy_for(session: Session, region: Region, recorded: Mapping[str, str] | None = None) -> PcrPolicy:
    """The region's manifest policy when an image manifest is registered for it (one manifest, or any of
    several during a rollout: provisioner/services/fleet/images.py); otherwise record mode against the node's
    recorded baseline (None: record now). docs/join-protocol.md "PCR policy hooks"."""
    manifest_policy = images.manifest_policy_for(session, region)
    if manifest_policy is not None:
        return manifest_policy
    return RecordPolicy({int(k): bytes.fromhex(v) for k, v in recorded.items()} if recorded else None)


# ---------------------------------------------------------------- refusals


@dataclass
class _Context:
    minion_id: str | None = None
    region: Region | None = None
    node: Node | None = None


def _refused(
    session: Session, refusal: Refusal, ctx: _Context, *, step: str, from_verifier: bool = False
) -> NoReturn:
    """Audit `refusal`, record it where the operator looks, commit, raise. `from_verifier`: the verifier's
    proof check refused it, so a code outside TRANSIENT came after the TPM activated the credential."""
    # Possession is proven only past credential activation: any earlier refusal may come from anyone
    # holding a join token (or none), so it may change nothing stored about the minion.
    proven = from_verifier and refusal.code not in TRANSIENT
    actor = f"minion:{ctx.minion_id or 'unknown'}"
    where = f" (region {ctx.region.name})" if ctx.region else ""
    reason = f"{step} refused{where}: {refusal.code.value}: {refusal.message}"
    detail = {k: v for k, v in refusal.detail.items() if k != "summary"}
    if detail:
        reason += " " + json.dumps(detail, sort_keys=True, default=str)
    audit.record(
        session,
        kind="join",
        resource_id=ctx.minion_id or "-",
        name=ctx.node.name if ctx.node else (ctx.minion_id or "-"),
        actor=actor,
        from_state=None,
        to_state=JoinOutcome.REFUSED.value,
        reason=reason,
    )
    node = ctx.node
    if node is not None:
        if proven and node.state not in NODE_STOPPED:
            node_service.transition(session, node, NodeState.ERRORED, actor=actor, reason=refusal.message)
        else:
            audit.note(
                session,
                kind=node_service.KIND,
                resource_id=node.id,
                name=node.name,
                actor=actor,
                state=node.state,
                reason=reason,
            )
    elif ctx.minion_id:
        _note_pending_refusal(
            session, ctx.minion_id, refusal, authenticated=ctx.region is not None, proven=proven
        )
    session.commit()
    raise refusal.as_error()


def _note_pending_refusal(
    session: Session, minion_id: str, refusal: Refusal, *, authenticated: bool, proven: bool
) -> None:
    """Show the refusal on the minion's pending listing (`provision node pending -o wide`) when the request
    may write there: an attested listing changes only through a verified proof, and an unattested one
    (what step 1 said, kept so the operator sees why a minion got no further) only by a request that
    carried a valid join token. Every refusal stays in the audit trail (`provision node refusals`)."""
    pending = session.get(PendingMinion, minion_id)
    if pending is None:
        return
    if proven or (authenticated and not pending.attested):
        pending.refusal = refusal.message


def _parse(session: Session, model: type[_Body], body: Any, ctx: _Context, *, step: str) -> _Body:
    """The request body as `model`, or the malformed_request refusal (audited) naming the first bad field."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where, what = ".".join(map(str, first["loc"])), plain_validation_message(str(first["msg"]))
        _refused(
            session,
            refuse(RefusalCode.malformed_request, f"{where}: {what}"),
            ctx,
            step=step,
        )


# ---------------------------------------------------------------- step 1: POST /v1/join


def _ek_spki(ek_public: bytes) -> bytes | None:
    try:
        return spki_der(public_key(parse_public(ek_public)))
    except (MalformedStructure, ValueError, TypeError):
        return None


def _pinned_spki(pinned: bytes) -> bytes:
    """A pinned EK as the provider gave it: PEM or DER SubjectPublicKeyInfo, or a TPM2B_PUBLIC."""
    if pinned.lstrip().startswith(b"-----BEGIN"):
        key = serialization.load_pem_public_key(pinned)
        return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    try:
        serialization.load_der_public_key(pinned)
        return pinned
    except ValueError:
        return _ek_spki(pinned) or pinned


def begin(session: Session, body: Any) -> JoinChallenge | KeyJoinChallenge:  # noqa: C901
    """Step 1 for either identity: a TPM's JoinRequest, or a device's KeyJoinRequest (its body names a
    `device_key`)."""
    ctx = _Context(
        minion_id=body.get("minion_id")
        if isinstance(body, dict) and isinstance(body.get("minion_id"), str)
        else None
    )
    if ctx.minion_id and len(ctx.minion_id) > 32:
        ctx.minion_id = None
    request: JoinRequest | KeyJoinRequest
    if isinstance(body, dict) and "device_key" in body:
        request = _parse(session, KeyJoinRequest, body, ctx, step="join")
    else:
        request = _parse(session, JoinRequest, body, ctx, step="join")
    from provisioner.services.fleet.rejections import refusal_for  # `provision node reject`: refused first

    if (rejected := refusal_for(session, request.minion_id)) is not None:
        _refused(session, rejected, ctx, step="join")
    resolved = join_tokens.resolve(session, request.join_token)
    if isinstance(resolved, Refusal):
        _refused(session, resolved, ctx, step="join")
    token, region = resolved
    ctx.region = region
    node = node_service.by_minion_id(session, request.minion_id)
    if node is not None and node.region_id == region.id:
        ctx.node = node
    outcome: tuple[JoinChallenge | KeyJoinChallenge, PendingJoin | PendingKeyJoin]
    if isinstance(request, KeyJoinRequest):
        outcome = _begin_with_key(session, request, region, node, ctx)
        ek_sha = _sha(request.device_key)
    else:
        outcome = _begin_with_tpm(session, request, region, node, ctx)
        ek_sha = _sha(_ek_spki(request.ek_public) or request.ek_public)
    challenge, pending = outcome
    # Identity checks that need the store.
    if node is not None and node.region_id != region.id:
        _refused(
            session,
            refuse(
                RefusalCode.wrong_region,
                f"node '{node.name}' is in region '{node.region.name}', the token is for '{region.name}'",
                node=node.name,
                node_region=node.region.name,
            ),
            ctx,
            step="join",
        )
    known_ek = _known_ek(session, request.minion_id, node)
    if known_ek is not None and known_ek != ek_sha:
        _refused(
            session,
            refuse(
                RefusalCode.duplicate_minion_id,
                f"recorded EK sha256 {known_ek[:16]}…, presented {ek_sha[:16]}…",
            ),
            ctx,
            step="join",
        )
    failing = failed_rules(request.requirements)
    # Nothing this request reports is proven yet (anyone holding the join token can replay or edit
    # step 1): the report waits in the JoinAttempt until finish() has verified the proof. Only a minion
    # nobody has seen attest may be listed from it, marked unattested, so the operator sees why a minion
    # that fails its requirements never got further.
    if node is None:
        _note_unattested_pending(session, request, region, ek_sha)
    if request.requirements.get("ok") is False or failing:
        _refused(
            session,
            refuse(
                RefusalCode.requirements_failed, ", ".join(failing) or "see the node's report", rules=failing
            ),
            ctx,
            step="join",
        )
    if node is not None and node.state == NodeState.ERRORED:
        raise Conflict(
            f"node '{node.name}' is errored ({node.reason}): fix the cause and run "
            f"`provision node retry {node.name}`",
            code="node_errored",
        )
    session.add(
        JoinAttempt(
            join_id=pending.join_id,
            region_id=region.id,
            minion_id=pending.minion_id,
            token_sha256=token.token_sha256,
            pending=pending.model_dump_json(),
            report={"inventory": request.inventory or None, "requirements": request.requirements or None},
        )
    )
    session.flush()
    return challenge


def _begin_with_tpm(
    session: Session, request: JoinRequest, region: Region, node: Node | None, ctx: _Context
) -> tuple[JoinChallenge, PendingJoin]:
    # A node pinned to an EK (GCP VMs) joins with that EK only, and the pin is its trust: a vTPM's
    # certificate (Google's CA) need not chain to a vendor CA the operator added.
    pinned = node.pinned_ek_public if node is not None and node.region_id == region.id else None
    spki = _ek_spki(request.ek_public)
    if pinned is not None and spki is not None and _pinned_spki(pinned) != spki:
        _refused(session, refuse(RefusalCode.pinned_ek_mismatch, f"node '{node.name}'"), ctx, step="join")  # type: ignore[union-attr]
    trust = RegionTrust(
        tpm_cas.trust_store(session),
        allow_ek_without_certificate=bool((region.settings or {}).get(ALLOW_EK_WITHOUT_CERT))
        or pinned is not None,
        pinned_ek=_pinned_spki(pinned) if pinned is not None else None,
    )
    outcome = JoinVerifier(nonce_store.issuer(session)).begin(request, trust)
    if isinstance(outcome, Refusal):
        _refused(session, outcome, ctx, step="join")
    return outcome


def _begin_with_key(
    session: Session, request: KeyJoinRequest, region: Region, node: Node | None, ctx: _Context
) -> tuple[KeyJoinChallenge, PendingKeyJoin]:
    """A device without a TPM: only where the region allows it, only for a device, and never for a
    minion that has (or attested with) a TPM — the weaker identity must not replace a stronger one."""
    _refuse_unless_allowed(session, region, ctx, step="join")
    if node is not None and node.region_id == region.id and node.service != Service.DEVICE:
        _refused(
            session,
            refuse(RefusalCode.device_key_not_a_device, f"'{node.name}' is a {node.service} node"),
            ctx,
            step="join",
        )
    downgrade = _tpm_evidence(request)
    if downgrade is not None:
        _refused(session, refuse(RefusalCode.identity_downgrade, downgrade), ctx, step="join")
    outcome = KeyJoinVerifier(nonce_store.issuer(session)).begin(request)
    if isinstance(outcome, Refusal):
        _refused(session, outcome, ctx, step="join")
    return outcome


def _refuse_unless_allowed(session: Session, region: Region, ctx: _Context, *, step: str) -> None:
    if not (region.settings or {}).get(ALLOW_DEVICES_WITHOUT_TPM):
        _refused(session, refuse(RefusalCode.device_key_not_allowed, f"region {region.name}"), ctx, step=step)


def _tpm_evidence(request: KeyJoinRequest) -> str | None:
    """Why this device is known to have a TPM by its own report, or None: a TPM in the kernel, or a Jetson
    model whose firmware has one. (A minion that attested with a TPM before has another minion_id: the
    verifier refuses a device key claiming it as a minion_id mismatch.)"""
    tpm = request.inventory.get("tpm")
    if isinstance(tpm, Mapping) and tpm.get("present"):
        return f"its inventory reports a TPM ({tpm.get('device') or 'present'})"
    device = request.inventory.get("device")
    if isinstance(device, Mapping) and device.get("tpm") not in (None, "none"):
        return f"its model {device.get('model')} has a {device.get('tpm')} TPM"
    return None


def _known_ek(session: Session, minion_id: str, node: Node | None) -> str | None:
    if node is not None:
        att = session.get(NodeAttestation, node.id)
        if att is not None:
            return att.ek_sha256
    pending = session.get(PendingMinion, minion_id)
    return pending.ek_sha256 if pending is not None else None


def _note_unattested_pending(
    session: Session, request: JoinRequest | KeyJoinRequest, region: Region, ek_sha: str
) -> None:
    """List a minion that has never attested (`attested: false`) with what it says. A minion that has
    attested is left alone: its listing changes only through a verified proof (_record_pending)."""
    row = session.get(PendingMinion, request.minion_id)
    if row is not None and row.attested:
        return
    _record_pending(
        session,
        request.minion_id,
        region,
        ek_sha,
        {"inventory": request.inventory or None, "requirements": request.requirements or None},
        attested=False,
        identity=_identity_of(request),
    )


def _identity_of(request: JoinRequest | KeyJoinRequest) -> MinionIdentity:
    return MinionIdentity.DEVICE_KEY if isinstance(request, KeyJoinRequest) else MinionIdentity.TPM


def _record_pending(
    session: Session,
    minion_id: str,
    region: Region,
    ek_sha: str,
    report: Mapping[str, Any],
    *,
    attested: bool,
    identity: MinionIdentity,
) -> None:
    row = session.get(PendingMinion, minion_id)
    now = _now()
    if row is None:
        row = PendingMinion(minion_id=minion_id, region_id=region.id, ek_sha256=ek_sha, first_seen=now)
        session.add(row)
    row.region_id = region.id
    row.last_seen = now
    row.attested = attested
    row.identity = identity
    row.inventory = report.get("inventory")
    row.requirements = report.get("requirements")
    if attested:
        # Only a verified proof clears the last refusal: a refused minion retries step 1 at once, and step 1
        # proves nothing, so the listing keeps saying why it got no further until it does.
        row.refusal = None
    session.flush()


# ---------------------------------------------------------------- step 2: POST /v1/join/{id}/proof


def finish(  # noqa: C901
    session: Session,
    join_id: str,
    join_token: str | None,
    body: Any,
    *,
    observed_address: str | None = None,
    timing: HeartbeatTiming = HeartbeatTiming(),
) -> JoinResult:
    attempt = session.get(JoinAttempt, join_id)
    ctx = _Context()
    if attempt is None:
        _refused(session, refuse(RefusalCode.nonce_unknown, f"no join {join_id}"), ctx, step="proof")
    ctx.minion_id = attempt.minion_id
    if not join_token or join_tokens.digest(join_token) != attempt.token_sha256:
        raise Unauthorized(
            "the proof must carry the join token that started this join: restart the join",
            code="join_token_invalid",
        )
    resolved = join_tokens.resolve(session, join_token)
    if isinstance(resolved, Refusal):
        _refused(session, resolved, ctx, step="proof")
    _, region = resolved
    ctx.region = region
    # The attempt is kept (purged after JOIN_ATTEMPT_TTL): its nonce is single use, so a second proof
    # for it is refused as a replay by the nonce check, which is what the operator should read.
    pending = pending_from_json(attempt.pending)
    node = node_service.by_minion_id(session, pending.minion_id)
    if node is not None and node.region_id != region.id:
        node = None
    ctx.node = node
    att = session.get(NodeAttestation, node.id) if node is not None else None
    if isinstance(pending, PendingKeyJoin):
        proven = _finish_with_key(session, pending, body, ctx)
    else:
        proven = _finish_with_tpm(session, pending, body, region, att, ctx)
    report = attempt.report or {}  # proven now: what step 1 reported may be recorded
    if node is None:
        _record_pending(
            session,
            pending.minion_id,
            region,
            proven.ek_sha256,
            report,
            attested=True,
            identity=proven.identity,
        )
        return JoinResult(
            state=JoinOutcome.PENDING.value,
            message="attested; waiting for an operator to run `provision node add NAME "
            f"--region {region.name} --minion-id {pending.minion_id}`",
            heartbeat_interval_s=timing.interval_s,
        )
    if node.state == NodeState.ERRORED:
        session.commit()
        raise Conflict(
            f"node '{node.name}' is errored ({node.reason}): fix the cause and run "
            f"`provision node retry {node.name}`",
            code="node_errored",
        )
    # a device must report a Jetson and a compute or storage node must not (services/fleet/device_join.py)
    mismatch = device_join.service_mismatch(node, report.get("inventory"))
    if mismatch is not None and node.state in NODE_AWAITING_MINION:
        node_service.transition(
            session, node, NodeState.ERRORED, actor=f"minion:{node.minion_id}", reason=mismatch
        )
        session.commit()
        raise Conflict(mismatch, code="device_section_mismatch")
    credential = _record_attestation(session, node, proven, att)
    node_service.record_report(
        session, node, inventory=report.get("inventory"), requirements=report.get("requirements")
    )
    waiting = session.get(PendingMinion, node.minion_id)
    if waiting is not None:  # adopted while it waited (or between its two calls): keep what it reported
        if node.inventory is None and waiting.attested:
            node_service.record_report(
                session, node, inventory=waiting.inventory, requirements=waiting.requirements
            )
        session.delete(waiting)
    # before the first finalize work: a storage node's NFS address when no hostname is set
    node_address.record(node, observed_address)
    if node.state == NodeState.NEW:  # only a verified proof starts a node's join (docs/join-protocol.md)
        node_service.transition(
            session,
            node,
            NodeState.ENROLLING,
            actor=f"minion:{node.minion_id}",
            reason=proven.started,
        )
    if node.state == NodeState.ENROLLING:
        node_service.transition(
            session,
            node,
            NodeState.PROVISIONING,
            actor=f"minion:{node.minion_id}",
            reason=proven.attested,
        )
        wake_after_commit(session, Wake.FINALIZE)
    return JoinResult(
        state=node.state,
        message="attested",
        node_id=node.id,
        node_name=node.name,
        node_credential=credential,
        heartbeat_interval_s=timing.interval_s,
    )


@dataclass(frozen=True)
class _Proven:
    """What a verified proof of either identity records for the node, and the history lines it gives."""

    identity: MinionIdentity
    ek_sha256: str  # the EK's (a device key's) SHA-256 over its SubjectPublicKeyInfo
    ak_public: bytes  # the AK (a device key's SPKI): what every later quote (signature) verifies with
    pcr_record: dict[int, bytes] | None
    started: str
    attested: str


def _finish_with_tpm(
    session: Session,
    pending: PendingJoin,
    body: Any,
    region: Region,
    att: NodeAttestation | None,
    ctx: _Context,
) -> _Proven:
    proof = _parse(session, ProofRequest, body, ctx, step="proof")
    policy = pcr_policy_for(session, region, att.pcr_record if att else None)
    boot = images.boot_path_policy_for(session, region)
    outcome = JoinVerifier(nonce_store.issuer(session)).finish(pending, proof, policy, boot)
    if isinstance(outcome, Refusal):
        _refused(session, outcome, ctx, step="proof", from_verifier=True)
    return _tpm_proven(outcome, policy)


def _tpm_proven(attested: Attested, policy: PcrPolicy) -> _Proven:
    return _Proven(
        identity=MinionIdentity.TPM,
        ek_sha256=_sha(_ek_spki(attested.ek_public) or attested.ek_public),
        ak_public=attested.ak_public,
        pcr_record=attested.pcr_record,
        started="join started: EK verified, credential activated",
        attested=f"attested: EK, AK and PCRs verified ({policy.mode.value} policy)",
    )


def _finish_with_key(session: Session, pending: PendingKeyJoin, body: Any, ctx: _Context) -> _Proven:
    proof = _parse(session, KeyProofRequest, body, ctx, step="proof")
    if ctx.region is not None:  # withdrawn between the two calls: read again when the join completes
        _refuse_unless_allowed(session, ctx.region, ctx, step="proof")
    outcome = KeyJoinVerifier(nonce_store.issuer(session)).finish(pending, proof)
    if isinstance(outcome, Refusal):
        _refused(session, outcome, ctx, step="proof", from_verifier=True)
    return _key_proven(outcome)


def _key_proven(attested: KeyAttested) -> _Proven:
    return _Proven(
        identity=MinionIdentity.DEVICE_KEY,
        ek_sha256=_sha(attested.device_key),
        ak_public=attested.device_key,
        pcr_record=None,
        started="join started: device key signature verified (no TPM)",
        attested="device key proven: no TPM, no boot measurements (the region allows devices without a TPM)",
    )


def _record_attestation(session: Session, node: Node, proven: _Proven, att: NodeAttestation | None) -> str:
    credential = node_credentials.new_credential()
    if att is None:
        att = NodeAttestation(node_id=node.id, ek_sha256=proven.ek_sha256, ak_public=proven.ak_public)
        session.add(att)
    att.ek_sha256 = proven.ek_sha256
    att.ak_public = proven.ak_public
    att.identity = proven.identity
    if proven.pcr_record is not None:
        att.pcr_record = {str(i): v.hex() for i, v in sorted(proven.pcr_record.items())}
    att.credential_sha256 = node_credentials.digest(credential)
    att.attested_at = _now()
    att.quote_nonce = None
    att.quote_asked_beat = None
    session.flush()
    return credential


def purge_stale(session: Session) -> None:
    """Forget join attempts and nonces nobody can use any more (called by the region health pass)."""
    cutoff = _now() - JOIN_ATTEMPT_TTL
    session.execute(delete(JoinAttempt).where(JoinAttempt.created_at < cutoff))
    DbNonceStore(session).purge(cutoff)
