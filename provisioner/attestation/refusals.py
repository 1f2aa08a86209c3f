"""Why an attestation was refused, as data: one enum member per reason, each with the sentence an
operator reads in the audit log and in `provision node pending`, and the API error it becomes.

Refusals are returned, not raised: the join service records every one in the audit log (who, which
minion_id, which step), and only then turns it into an HTTP answer with `Refusal.as_error()`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from contracts.errors import Conflict, Forbidden, InvalidInput, RigbaseError
from provisioner.domain.text import printable


class RefusalCode(StrEnum):
    """Each value is the machine-readable `code` in the API error and the audit entry."""

    malformed_request = "attestation_malformed_request"
    ek_invalid = "attestation_ek_invalid"
    ek_untrusted_ca = "attestation_ek_untrusted_ca"
    ek_certificate_missing = "attestation_ek_certificate_missing"
    ek_certificate_mismatch = "attestation_ek_certificate_mismatch"
    minion_id_mismatch = "attestation_minion_id_mismatch"
    ak_invalid = "attestation_ak_invalid"
    wrong_secret = "attestation_wrong_secret"
    quote_malformed = "attestation_quote_malformed"
    quote_signature_invalid = "attestation_quote_signature_invalid"
    nonce_unknown = "attestation_nonce_unknown"
    nonce_replayed = "attestation_nonce_replayed"
    nonce_expired = "attestation_nonce_expired"
    nonce_mismatch = "attestation_nonce_mismatch"
    pcr_selection_mismatch = "attestation_pcr_selection_mismatch"
    pcr_digest_mismatch = "attestation_pcr_digest_mismatch"
    pcr_manifest_mismatch = "attestation_pcr_manifest_mismatch"
    pcr_changed = "attestation_pcr_changed"
    # the boot path behind PCR 4, from the firmware's event log (provisioner/attestation/boot_path.py)
    event_log_mismatch = "attestation_event_log_mismatch"
    no_event_log = "attestation_no_event_log"
    unknown_boot_application = "attestation_unknown_boot_application"
    # enrollment checks around the protocol (provisioner/services/fleet/join.py)
    join_token_invalid = "join_token_invalid"
    join_token_revoked = "join_token_revoked"
    join_token_expired = "join_token_expired"
    duplicate_minion_id = "attestation_duplicate_minion_id"
    wrong_region = "join_wrong_region"
    pinned_ek_mismatch = "attestation_pinned_ek_mismatch"
    requirements_failed = "join_requirements_failed"
    minion_rejected = "join_minion_rejected"  # `provision node reject MINION_ID`
    # devices without a TPM (provisioner/attestation/device_key.py, docs/join-protocol.md)
    device_key_invalid = "attestation_device_key_invalid"
    device_key_signature_invalid = "attestation_device_key_signature_invalid"
    device_key_not_allowed = "join_device_key_not_allowed"
    device_key_not_a_device = "join_device_key_not_a_device"
    identity_downgrade = "attestation_identity_downgrade"


# The operator-facing sentence per code: what happened and what to do next. `{detail}` is filled from
# Refusal.detail["summary"] when the step has specifics (which CA, which PCRs).
MESSAGES: dict[RefusalCode, str] = {
    RefusalCode.malformed_request: "The join request is malformed ({detail}); update the minion and retry.",
    RefusalCode.ek_invalid: (
        "The endorsement key is not a standard RSA-2048 EK ({detail}); this TPM cannot join."
    ),
    RefusalCode.ek_untrusted_ca: (
        "The EK certificate does not chain to a trusted TPM vendor CA ({detail}); if you trust the vendor, "
        "a root admin adds its CA with `provision tpm-ca add`."
    ),
    RefusalCode.ek_certificate_missing: (
        "The TPM has no EK certificate and this region does not accept EKs without one; enable that "
        "per region only if you trust the hardware's origin."
    ),
    RefusalCode.ek_certificate_mismatch: (
        "The EK certificate certifies a different key than the TPM's EK; the node may be impersonating "
        "another TPM, investigate before retrying."
    ),
    RefusalCode.minion_id_mismatch: (
        "The claimed minion_id does not match the EK ({detail}); the node misreports its identity, "
        "check its software."
    ),
    RefusalCode.ak_invalid: (
        "The attestation key is not a restricted signing key ({detail}); update the minion."
    ),
    RefusalCode.wrong_secret: (
        "The node could not recover the credential secret, so its AK is not in the TPM that owns this EK; "
        "the join is refused, investigate the node."
    ),
    RefusalCode.quote_malformed: (
        "The TPM quote is malformed ({detail}); retry the join, then check the node."
    ),
    RefusalCode.quote_signature_invalid: (
        "The TPM quote's signature does not verify with the node's AK; the quote was altered, "
        "investigate the node."
    ),
    RefusalCode.nonce_unknown: (
        "The attestation nonce was never issued by this control plane; restart the join."
    ),
    RefusalCode.nonce_replayed: (
        "The attestation nonce was already used (a replay); restart the join for a fresh one."
    ),
    RefusalCode.nonce_expired: (
        "The attestation nonce expired before the proof arrived ({detail}); restart the join."
    ),
    RefusalCode.nonce_mismatch: (
        "The quote is not over this challenge's nonce (a stale or replayed quote); restart the join."
    ),
    RefusalCode.pcr_selection_mismatch: (
        "The quote does not cover the required PCRs ({detail}); update the minion."
    ),
    RefusalCode.pcr_digest_mismatch: (
        "The reported PCR values do not hash to the quoted PCR digest; the node misreports its measurements."
    ),
    RefusalCode.pcr_manifest_mismatch: (
        "PCR values differ from the image manifest ({detail}); the node did not boot the registered image, "
        "reinstall it from the region's boot media."
    ),
    RefusalCode.pcr_changed: (
        "PCR values changed since they were recorded ({detail}); the node's boot chain changed, "
        "inspect it and re-record with the operator's approval."
    ),
    RefusalCode.event_log_mismatch: (
        "The TCG event log does not replay to the quoted PCR 4 ({detail}); it is not this boot's log or "
        "was altered, investigate the node before `provision node retry`."
    ),
    RefusalCode.no_event_log: (
        "The quote carries no TCG event log, and this region's registered images need one to check the "
        "boot path; boot the node from the region's current media (its minion sends the log)."
    ),
    RefusalCode.unknown_boot_application: (
        "The firmware ran an EFI application no registered image names ({detail}); the node booted "
        "something other than the region's media, reinstall it from that media or register its image."
    ),
    RefusalCode.join_token_invalid: (
        "The join token is not one this control plane issued for any region; write a new bundle with "
        "`provision region bundle REGION -o FILE`."
    ),
    RefusalCode.join_token_revoked: (
        "The join token was revoked ({detail}); issue a new one with `provision region join-token REGION` "
        "or a new bundle."
    ),
    RefusalCode.join_token_expired: (
        "The join token expired ({detail}); issue a new one with `provision region join-token REGION` "
        "or a new bundle."
    ),
    RefusalCode.duplicate_minion_id: (
        "This minion_id was already attested with a different EK ({detail}); two TPMs claim one identity, "
        "investigate both machines before removing the node."
    ),
    RefusalCode.wrong_region: (
        "This minion belongs to a node of another region ({detail}); boot it with that region's bundle "
        "or remove the node and add it to this region."
    ),
    RefusalCode.pinned_ek_mismatch: (
        "The EK differs from the one pinned for this node ({detail}); the provider reported another TPM, "
        "replace the node if its hardware changed."
    ),
    RefusalCode.requirements_failed: (
        "The node fails its hardware requirements ({detail}); fix them (`minion check` explains each) and "
        "reboot the node."
    ),
    RefusalCode.minion_rejected: (
        "An operator rejected this minion ({detail}); it cannot join until `provision node unreject` "
        "lifts that."
    ),
    RefusalCode.device_key_invalid: (
        "The device key is not an ECDSA P-256 public key ({detail}); update the minion."
    ),
    RefusalCode.device_key_signature_invalid: (
        "The proof's signature does not verify with the device key, so it was not made by the device "
        "holding that key; restart the join, and investigate if it happens again."
    ),
    RefusalCode.device_key_not_allowed: (
        "This region does not accept devices without a TPM ({detail}); allow them with `provision region "
        "update REGION --allow-devices-without-tpm` if you trust where the devices come from."
    ),
    RefusalCode.device_key_not_a_device: (
        "Only devices may join with a device key ({detail}); compute and storage nodes join with their TPM."
    ),
    RefusalCode.identity_downgrade: (
        "This minion has a TPM, so a device key cannot stand in for it ({detail}); run the minion without "
        "--device-key so it attests with its TPM."
    ),
}

# The same refusals met in a heartbeat's quote (continuous attestation) errored an enrolled node: "restart
# the join" is the wrong next step there, the operator investigates and retries the node.
HEARTBEAT_MESSAGES: dict[RefusalCode, str] = {
    RefusalCode.quote_malformed: (
        "The TPM quote is malformed ({detail}); update the minion, then `provision node retry NAME`."
    ),
    RefusalCode.nonce_unknown: (
        "The quote answers an attestation nonce this control plane never issued; investigate the node, "
        "then `provision node retry NAME`."
    ),
    RefusalCode.nonce_replayed: (
        "The quote answers an attestation nonce that was already used (a replay); investigate the node, "
        "then `provision node retry NAME`."
    ),
    RefusalCode.nonce_mismatch: (
        "The quote is not over the nonce this control plane asked for (a stale or replayed quote); "
        "investigate the node, then `provision node retry NAME`."
    ),
    RefusalCode.device_key_signature_invalid: (
        "The answer's signature does not verify with the device key, so it was not made by the device "
        "holding that key; investigate the device, then `provision node retry NAME`."
    ),
}

# Malformed input is the client's bug (422); a challenge that went stale before its proof came is a race
# with the clock, not a failed authentication (409: a slow link or a busy TPM, and fifty of them from one
# NATed site must not spend that address's failed-authentication budget, api/limits.py); everything else
# is a trust decision (403).
_ERROR_CLASS: dict[RefusalCode, type[RigbaseError]] = {
    RefusalCode.malformed_request: InvalidInput,
    RefusalCode.nonce_expired: Conflict,
}


@dataclass(frozen=True)
class Refusal:
    """One refusal: its code, the sentence for the operator, and structured detail for the audit log."""

    code: RefusalCode
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def message(self) -> str:
        return self._sentence(MESSAGES[self.code])

    @property
    def heartbeat_message(self) -> str:
        """The sentence when a heartbeat's quote met this refusal (the node is errored, not joining)."""
        return self._sentence(HEARTBEAT_MESSAGES.get(self.code, MESSAGES[self.code]))

    def _sentence(self, template: str) -> str:
        return template.format(detail=self.detail.get("summary", "no detail"))

    def as_error(self) -> RigbaseError:
        return _ERROR_CLASS.get(self.code, Forbidden)(self.message, code=self.code.value)

    def to_json(self) -> dict[str, Any]:
        return {"code": self.code.value, "message": self.message, "detail": self.detail}


def refuse(code: RefusalCode, summary: str | None = None, **extra: Any) -> Refusal:
    """`summary` may quote the client (a field path from a malformed request): it is escaped to one line
    and bounded, so it can neither forge a line in `provision node refusals` nor flood the audit trail."""
    detail: dict[str, Any] = dict(extra)
    if summary is not None:
        detail["summary"] = printable(summary)
    return Refusal(code, detail)
