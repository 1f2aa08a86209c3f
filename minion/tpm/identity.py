"""The node's identity for humans: minion_id, shown on the console banner and typed by the operator
into `provision node add --minion-id`. Derived from the TPM's EK, so reinstalling the OS keeps it."""

from __future__ import annotations

from contracts.identity import minion_id_from_spki
from minion.tpm.errors import TpmUnavailable
from minion.tpm.session import TpmSession

__all__ = ["TpmUnavailable", "minion_id", "minion_id_from_spki"]


def minion_id(tcti: str | None = None) -> str:
    """minion_id of the TPM on `tcti` (default `device:/dev/tpmrm0`; the CLI passes
    `--tcti`, whose default is $RIGBASE_TCTI).

    Raises TpmUnavailable, whose message says what to check, when no TPM answers."""
    with TpmSession(tcti) as session:
        return session.endorsement_key().minion_id
