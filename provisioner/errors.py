"""Errors the service layer raises. Each carries a machine-readable code, an HTTP status and one
human sentence that says what to do next; the API turns them into JSON and the CLI into one line
on stderr (exit 1, or 2 for usage errors)."""

from __future__ import annotations

from typing import ClassVar


class RigbaseError(Exception):
    """Base of every refusal the control plane gives. `message` is shown to the operator as is."""

    status: ClassVar[int] = 400
    default_code: ClassVar[str] = "error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code

    def to_json(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


class InvalidInput(RigbaseError):
    """Malformed input: a bad name, a bad key file, an out-of-range port."""

    status = 422
    default_code = "invalid_input"


class NotFound(RigbaseError):
    status = 404
    default_code = "not_found"


class Conflict(RigbaseError):
    """A uniqueness rule: duplicate name, duplicate minion_id, a second storage node."""

    status = 409
    default_code = "conflict"


class RuleViolation(RigbaseError):
    """A product rule refuses the request: an illegal transition, a device in a local-storage region."""

    status = 409
    default_code = "rule_violation"


class Unauthorized(RigbaseError):
    status = 401
    default_code = "unauthorized"


class Forbidden(RigbaseError):
    status = 403
    default_code = "forbidden"


class Unavailable(RigbaseError):
    """A dependency is down: the database, a cloud API."""

    status = 503
    default_code = "unavailable"
