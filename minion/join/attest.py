"""The minion's half of the attested join (docs/join-protocol.md), transport-free:

    payload = join_request(session, ak, join_token=…, inventory=…, requirements=…)  # POST /v1/join
    challenge = parse_challenge(response_body)
    proof = proof_payload(session, ak, challenge)  # POST /v1/join/{id}/proof

and `quote_payload` for the quotes continuous attestation asks for in heartbeat responses. Each quote
carries the firmware's TCG event log when the node has one (`read_event_log`), so the control plane can
replay PCR 4 and check the boot path (docs/join-protocol.md, "Boot path (PCR 4)").
The messages are the shared contract (contracts/messages.py): the minion builds and parses them with the
same models the control plane uses, and the JSON document they produce is protocol version 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from contracts.attestation import PCR_BANK
from contracts.eventlog import MAX_EVENT_LOG_BYTES
from contracts.messages import JoinChallenge, JoinRequest, ProofRequest, QuoteMessage, to_wire
from minion.tpm.session import AttestationKey, Quote, TpmSession


def parse_challenge(body: Mapping[str, Any]) -> JoinChallenge:
    """The body of the control plane's answer to POST /v1/join. Raises ValueError when it is unusable."""
    if body.get("pcr_bank", PCR_BANK) != PCR_BANK:
        raise ValueError(
            f"the control plane asks for PCR bank {body.get('pcr_bank')!r}; only sha256 is supported"
        )
    try:
        return JoinChallenge.model_validate(body)
    except ValidationError as exc:
        raise ValueError(f"the control plane's join challenge is malformed: {exc}") from None


def join_request(
    session: TpmSession,
    ak: AttestationKey,
    *,
    join_token: str,
    inventory: Mapping[str, Any] | None = None,
    requirements: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """POST /v1/join body: identity (minion_id, EK, EK certificate, AK) plus the node's reports."""
    ek = session.endorsement_key()
    return to_wire(
        JoinRequest(
            minion_id=ek.minion_id,
            ek_public=ek.public,
            ek_certificate=ek.certificate or None,
            ak_public=ak.public,
            join_token=join_token,
            inventory=dict(inventory or {}),
            requirements=dict(requirements or {}),
        )
    )


def read_event_log(path: Path | None) -> bytes | None:
    """The firmware's event log (MinionSettings.event_log), or None when there is none to send: no such
    file (a VM without a firmware TPM log, the lab's swtpm), unreadable, empty, or larger than any real
    log (the control plane would refuse the message)."""
    if path is None:
        return None
    try:
        with path.open("rb") as f:
            data = f.read(MAX_EVENT_LOG_BYTES + 1)
    except OSError:
        return None
    return data if 0 < len(data) <= MAX_EVENT_LOG_BYTES else None


def quote_message(quote: Quote, event_log: bytes | None = None) -> QuoteMessage:
    return QuoteMessage(
        attest=quote.attest,
        signature=quote.signature,
        pcr_bank=PCR_BANK,
        pcrs=dict(sorted(quote.pcrs.items())),
        event_log=event_log,
    )


def quote_payload(
    session: TpmSession,
    ak: AttestationKey,
    nonce: bytes,
    pcrs: tuple[int, ...] | list[int] | None = None,
    event_log: bytes | None = None,
) -> dict[str, Any]:
    """A quote over `nonce` in wire form (join proof and continuous attestation)."""
    quote = session.quote(ak, nonce, pcrs) if pcrs else session.quote(ak, nonce)
    return to_wire(quote_message(quote, event_log))


def proof_payload(
    session: TpmSession, ak: AttestationKey, challenge: JoinChallenge, event_log: bytes | None = None
) -> dict[str, Any]:
    """POST /v1/join/{join_id}/proof body: the activated secret and a quote over the challenge's nonce,
    with the firmware's event log when the node has one."""
    secret = session.activate_credential(ak, challenge.credential_blob, challenge.encrypted_secret)
    quote = (
        session.quote(ak, challenge.nonce, challenge.pcrs)
        if challenge.pcrs
        else session.quote(ak, challenge.nonce)
    )
    return to_wire(ProofRequest(activated_secret=secret, quote=quote_message(quote, event_log)))
