"""What an operator does about joins: retry an errored node (it joins again from scratch) and let a
region accept EKs without a vendor certificate."""

from __future__ import annotations

from sqlalchemy.orm import Session

from contracts.errors import Conflict
from provisioner.domain.states import NodeState
from provisioner.services.common import audit
from provisioner.services.fleet import finalize
from provisioner.services.fleet import nodes as node_service
from provisioner.services.fleet.join import ALLOW_DEVICES_WITHOUT_TPM, ALLOW_EK_WITHOUT_CERT
from provisioner.services.regions import regions as region_service
from provisioner.store.join_models import NodeAttestation
from provisioner.store.models import Node, Region


def retry(
    session: Session, ref: str, *, region: str | None = None, accept_pcrs: bool = False, actor: str
) -> Node:
    """errored → new: the minion's next attempt joins again (fresh attestation, then finalize of a new
    generation).
    `accept_pcrs` forgets the recorded PCR baseline, so the next join records the current values."""
    node = node_service.get(session, ref, region)
    if node.state != NodeState.ERRORED:
        raise Conflict(
            f"node '{node.name}' is {node.state}, not errored: nothing to retry", code="not_errored"
        )
    att = session.get(NodeAttestation, node.id)
    if att is not None:
        att.credential_sha256 = None  # the node proves itself again before anything else
        if accept_pcrs:
            att.pcr_record = None
    finalize.next_attempt(node)  # a new finalize generation: the minion runs the playbook again
    why = "retry by operator" + (" (PCR baseline reset)" if accept_pcrs else "")
    return node_service.transition(session, node, NodeState.NEW, actor=actor, reason=why)


def set_region_attestation(
    session: Session,
    ref: str,
    *,
    allow_ek_without_cert: bool | None = None,
    allow_devices_without_tpm: bool | None = None,
    actor: str,
) -> Region:
    """Change the region's attestation opt-ins; None leaves one as it is. Each change is an audit line."""
    region = region_service.get(session, ref)
    changes = {
        ALLOW_EK_WITHOUT_CERT: (allow_ek_without_cert, "EKs without a vendor certificate"),
        ALLOW_DEVICES_WITHOUT_TPM: (allow_devices_without_tpm, "devices without a TPM (device keys)"),
    }
    for key, (value, what) in changes.items():
        if value is None:
            continue
        region.settings = {**(region.settings or {}), key: value}
        audit.note(
            session,
            kind=region_service.KIND,
            resource_id=region.id,
            name=region.name,
            actor=actor,
            state=region.state,
            reason=f"{what} {'accepted' if value else 'refused'}",
        )
    session.flush()
    return region
