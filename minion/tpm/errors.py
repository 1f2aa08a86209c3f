"""Errors of the minion's TPM layer. One class so the CLI and the banner can say exactly what to fix."""

from __future__ import annotations


class TpmUnavailable(Exception):
    """No TPM answered on the chosen TCTI (missing device, stopped swtpm, bad TCTI string).

    The message names the TCTI and says what to try next; callers print it as one line."""

    def __init__(self, tcti: str, reason: str) -> None:
        super().__init__(
            f"no TPM reachable on TCTI {tcti!r} ({reason}); check that the TPM is enabled "
            "(/dev/tpmrm0) or pass --tcti / RIGBASE_TCTI, e.g. 'swtpm:path=/run/swtpm.sock'"
        )
        self.tcti = tcti
        self.reason = reason


class TpmError(Exception):
    """The TPM answered but refused an operation (e.g. no EK certificate where one is required)."""
