"""The region enrollment bundle (docs/enrollment-bundle.md): what `provision region bundle` writes, the
image builder copies onto the boot drive and the minion reads to join. One model, one list of required
keys, one reader and one writer, so the three programs cannot disagree on what a usable bundle is."""

from __future__ import annotations

import ipaddress
import json
import os
from pathlib import Path
from typing import Annotated, Any, Final, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from contracts.errors import InvalidInput
from contracts.ports import CONTROL_PLANE_PORT  # noqa: F401 - where the bundle's readers found it
from contracts.regional import StorageMode

BUNDLE_VERSION: Final = 1
# Every bundle the control plane writes carries these; a bundle without one of them cannot be used.
REQUIRED_KEYS: tuple[str, ...] = (
    "version",
    "control_plane_url",
    "region",
    "region_id",
    "provider",
    "join_token",
)
HOW_TO_FIX = "write a new one with `provision region bundle REGION -o FILE`"


def check_control_plane_url(url: str) -> str:
    """The URL a node joins at: http or https with a host, nothing else. A bundle is copied onto boot
    media and shown to operators, so `javascript:…`, `file:…` or a URL with a newline must not pass."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or not url.isprintable() or " " in url:
        raise InvalidInput(
            f"control plane URL {url!r} is not an http(s) URL with a host: use e.g. https://cp.example:8443",
            code="invalid_url",
        )
    return url


def is_loopback_url(url: str) -> bool:
    """Whether the URL's host is this machine (127.0.0.0/8, ::1, localhost): fine for a CLI, useless in a
    bundle, since every node flashed from it would dial itself."""
    host = (urlsplit(url).hostname or "").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def refuse_loopback(url: str, allow_flag: str = "--allow-loopback") -> str:
    """`url`, or InvalidInput when it points at loopback: media made from it could never reach the
    control plane, and nothing would say so until a node sat unreachable at a rack."""
    if is_loopback_url(url):
        raise InvalidInput(
            f"control plane URL {url} is this machine's loopback: nodes could never reach it; pass "
            f"--control-plane-url https://ADDRESS:PORT with an address nodes reach ({allow_flag} for a "
            "single-host test)",
            code="loopback_url",
        )
    return url


def _url_rule(url: str) -> str:
    try:
        return check_control_plane_url(url)
    except InvalidInput as exc:
        raise ValueError(exc.message) from None


class BundleError(InvalidInput):
    """The bundle cannot be used; the message names the file and what to do, `reason` is the short cause
    (for displays with no room for the whole sentence, such as the console banner)."""

    default_code = "invalid_bundle"

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class EnrollmentBundle(BaseModel):
    """Version 1. Field order is the order on disk. A reader ignores fields it does not know."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    version: Literal[1] = BUNDLE_VERSION
    control_plane_url: Annotated[str, AfterValidator(_url_rule)] = Field(min_length=1)
    ca_certificate: str | None = None  # PEM of the CA of the control plane's TLS certificate
    region: str = Field(min_length=1)
    region_id: str = Field(min_length=1)
    provider: str = Field(min_length=1)
    join_token: str = Field(min_length=1)  # secret: the file is written 0600
    expires_at: str | None = None  # RFC 3339 (UTC, "Z"), as the control plane wrote it
    storage_mode: StorageMode | None = None
    public_jobs: bool = False

    def to_json(self) -> str:
        """The file's text: two-space indent, no trailing newline (what `provision region bundle` writes)."""
        return json.dumps(self.model_dump(mode="json"), indent=2)


def parse_bundle(data: Any, source: str = "the enrollment bundle") -> EnrollmentBundle:
    """A bundle from its JSON value; BundleError says which keys are missing or wrong."""
    if not isinstance(data, dict):
        raise BundleError(f"{source} is not a JSON object; {HOW_TO_FIX}", reason="not a JSON object")
    missing = [key for key in REQUIRED_KEYS if data.get(key) in (None, "")]
    if missing:
        reason = f"missing {', '.join(missing)}"
        raise BundleError(
            f"{source} is not a version-1 enrollment bundle ({reason}); {HOW_TO_FIX}", reason=reason
        )
    if data["version"] != BUNDLE_VERSION:
        reason = f"unsupported version {data['version']!r}"
        raise BundleError(f"{source} has {reason}; {HOW_TO_FIX}", reason=reason)
    try:
        return EnrollmentBundle.model_validate(data)
    except ValidationError as exc:
        reason = "invalid " + ", ".join(".".join(str(p) for p in e["loc"]) for e in exc.errors())
        raise BundleError(f"{source} has {reason}; {HOW_TO_FIX}", reason=reason) from None


def read_bundle_bytes(path: Path) -> tuple[bytes, EnrollmentBundle]:
    """The file's exact bytes (the image manifest records their digest) and the parsed bundle."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise BundleError(
            f"cannot read the enrollment bundle {path} ({exc.strerror}); {HOW_TO_FIX}",
            reason=str(exc.strerror),
        ) from None
    try:
        data = json.loads(raw)
    except ValueError:
        raise BundleError(
            f"the enrollment bundle {path} is not JSON; {HOW_TO_FIX}", reason="not JSON"
        ) from None
    return raw, parse_bundle(data, f"the enrollment bundle {path}")


def read_bundle(path: Path) -> EnrollmentBundle:
    return read_bundle_bytes(path)[1]


def write_bundle(path: Path, bundle: EnrollmentBundle) -> None:
    """Atomically, and mode 0600 from the first byte: the bundle holds a join token."""
    tmp = path.with_name(path.name + ".tmp")
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(bundle.to_json())
    os.replace(tmp, path)
