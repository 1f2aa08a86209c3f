"""What a container image reference may be: a registry reference only (`[host[:port]/]path[:tag][@digest]`,
the grammar of the distribution project's reference package), so that podman never reads a host path
through one of its other transports (`dir:`, `oci-archive:`, `docker-archive:`, `containers-storage:` …)
and a value can never be read as an option (no leading `-`). Jobs and device configurations both use it;
the minion checks it again before it calls podman."""

from __future__ import annotations

import re
from typing import Annotated, Final

from pydantic import AfterValidator

_COMPONENT: Final = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_LABEL: Final = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_DOMAIN: Final = rf"(?:{_LABEL}(?:\.{_LABEL})*|\[[0-9A-Fa-f:]+\])(?::[0-9]{{1,5}})?"
_TAG: Final = r"[\w][\w.-]{0,127}"
_DIGEST: Final = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9A-Fa-f]{32,}"
REFERENCE: Final = re.compile(
    rf"(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*(?::{_TAG})?(?:@{_DIGEST})?", re.ASCII
)
MAX_LENGTH: Final = 512
# containers-image transports: `dir:x` also parses as the image `dir` with tag `x`, which podman would
# read as the transport, so a first component that names one is refused
TRANSPORTS: Final = frozenset(
    {
        "dir",
        "docker",
        "docker-archive",
        "docker-daemon",
        "oci",
        "oci-archive",
        "containers-storage",
        "ostree",
        "sif",
        "tarball",
    }
)
REFUSAL: Final = (
    "must be a registry image reference such as docker.io/library/python:3.12-slim (no transport "
    "prefix such as dir: or oci-archive:, no leading '-')"
)


def is_registry_reference(value: str) -> bool:
    if len(value) > MAX_LENGTH or not REFERENCE.fullmatch(value):
        return False
    first = value.split("/", 1)[0].split(":", 1)[0]
    return first not in TRANSPORTS


def _checked(value: str) -> str:
    if not is_registry_reference(value):
        raise ValueError(f"image {value[:80]!r} {REFUSAL}")
    return value


# a pydantic field type for every wire and spec key that names an image
RegistryImage = Annotated[str, AfterValidator(_checked)]


DOCKER_HUB: Final = "docker.io"
REGISTRY_HOST: Final = re.compile(_DOMAIN, re.ASCII)


def registry_of(image: str) -> str:
    """The registry host an image reference pulls from, as podman reads it: the first component when it
    looks like a host (a dot, a port, or `localhost`), Docker Hub otherwise."""
    first, _, rest = image.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first
    return DOCKER_HUB


def _checked_host(value: str) -> str:
    if not REGISTRY_HOST.fullmatch(value) or len(value) > 253:
        raise ValueError(f"registry {value[:80]!r} must be a host[:port] such as ghcr.io or nvcr.io")
    return value


RegistryHost = Annotated[str, AfterValidator(_checked_host)]
