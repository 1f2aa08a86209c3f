"""The one error base of rigbase's three programs. Each refusal carries a machine-readable `code` and one
human sentence (`message`) that says what to do next. Transport is not this module's business: the API
maps each class to an HTTP status (provisioner/api/errors.py), the CLIs print one line on stderr."""

from __future__ import annotations

from typing import ClassVar

# pydantic's wording in front of a validator's own message ("Value error, name is not a DNS label"): an
# operator reads the message, not the library's category
_PYDANTIC_PREFIXES = ("Value error, ", "Assertion failed, ")


def plain_validation_message(msg: str) -> str:
    """A pydantic error's `msg` without pydantic's category prefix."""
    for prefix in _PYDANTIC_PREFIXES:
        if msg.startswith(prefix):
            return msg[len(prefix) :]
    return msg


class RigbaseError(Exception):
    """Base of every refusal a program gives. `message` is shown to the operator as is."""

    default_code: ClassVar[str] = "error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code

    def to_json(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


class InvalidInput(RigbaseError):
    """Malformed input: a bad name, a bad key file, an out-of-range port."""

    default_code = "invalid_input"


class NotFound(RigbaseError):
    default_code = "not_found"


class Conflict(RigbaseError):
    """A uniqueness rule: duplicate name, duplicate minion_id, a second storage node."""

    default_code = "conflict"


class Gone(RigbaseError):
    """What was asked for existed and has ended: a job's URL after the job ended."""

    default_code = "gone"


class RuleViolation(RigbaseError):
    """A product rule refuses the request: an illegal transition, a device in a local-storage region."""

    default_code = "rule_violation"


class Unauthorized(RigbaseError):
    default_code = "unauthorized"


class Forbidden(RigbaseError):
    default_code = "forbidden"


class Unavailable(RigbaseError):
    """A dependency is down: the database, a cloud API."""

    default_code = "unavailable"
