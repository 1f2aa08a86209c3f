"""Service-account key validation for `provision provider enable gcp --credentials FILE`.

Checked before anything is stored or created, so a wrong file (an OAuth client secret, an API key, a
truncated download) fails with one line naming the field. Reading `-` from stdin is the caller's job:
this module takes the bytes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from contracts.errors import InvalidInput

REQUIRED_FIELDS = ("type", "project_id", "client_email", "private_key", "token_uri")


@dataclass(frozen=True)
class ServiceAccountKey:
    """What we show the operator (project, account) plus the raw key to seal at rest."""

    project_id: str
    client_email: str
    private_key_id: str | None
    token_uri: str
    raw: bytes

    def info(self) -> dict[str, Any]:
        """The key as google-auth's from_service_account_info wants it (never logged)."""
        return json.loads(self.raw)

    def public(self) -> dict[str, str]:
        return {"project_id": self.project_id, "client_email": self.client_email}


def _bad(field: str, why: str) -> InvalidInput:
    return InvalidInput(
        f"credentials: '{field}' {why}: "
        "download a JSON key for a service account (IAM > Service accounts > Keys)",
        code="invalid_credentials",
    )


def parse_key(raw: bytes | str) -> ServiceAccountKey:
    """Validate a service-account JSON key; raise InvalidInput naming the first bad field."""
    data = raw.encode() if isinstance(raw, str) else raw
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _bad(
            "file", f"is not JSON ({exc.__class__.__name__} at byte {getattr(exc, 'pos', 0)})"
        ) from None
    if not isinstance(doc, dict):
        raise _bad("file", "is not a JSON object")
    for name in REQUIRED_FIELDS:
        value = doc.get(name)
        if not isinstance(value, str) or not value.strip():
            raise _bad(name, "is missing or empty")
    if doc["type"] != "service_account":
        raise _bad("type", f"is '{doc['type']}', not 'service_account'")
    if "@" not in doc["client_email"]:
        raise _bad("client_email", "is not an e-mail address")
    if not doc["token_uri"].startswith("https://"):
        raise _bad("token_uri", "is not an https:// URL")
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        load_pem_private_key(doc["private_key"].encode(), password=None)
    except (ValueError, TypeError) as exc:
        raise _bad(
            "private_key", f"does not parse as an unencrypted PEM private key ({exc})".replace("\n", " ")
        ) from None
    return ServiceAccountKey(
        project_id=doc["project_id"],
        client_email=doc["client_email"],
        private_key_id=doc.get("private_key_id"),
        token_uri=doc["token_uri"],
        raw=data,
    )
