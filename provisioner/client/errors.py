"""The one error the operator API's client raises. It is data, not output: the CLI prints it as one line
with an exit code (provisioner/cli/common.py), the lab turns it into its own refusals."""

from __future__ import annotations

from contracts.errors import RigbaseError

HTTP_UNPROCESSABLE = 422  # the API's status for malformed input (contracts.errors.InvalidInput)


class ControlPlaneError(RigbaseError):
    """The control plane refused a request (its `code` and `message`, and the HTTP `status`), or it could
    not be reached or is not configured (`status` None)."""

    default_code = "control_plane_error"

    def __init__(self, message: str, *, code: str | None = None, status: int | None = None) -> None:
        super().__init__(message, code=code)
        self.status = status

    @property
    def malformed_input(self) -> bool:
        """The server judged the request malformed (the CLI exits 2 for it, as for its own usage errors)."""
        return self.status == HTTP_UNPROCESSABLE
