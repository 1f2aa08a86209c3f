"""One name prefix and one label set on everything rigbase creates in a project.

`provision provider remove gcp` and `region remove` delete by these names only, so a resource someone
else made in the same project is never touched. GCP names are RFC 1035 labels (≤ 63 chars, [a-z0-9-])."""

from __future__ import annotations

import hashlib
import re
import uuid

DEFAULT_PREFIX = "rigbase"
MANAGED_LABEL = "rigbase-managed"
REGION_LABEL = "rigbase-region"
REGION_ID_LABEL = "rigbase-region-id"
ROLE_LABEL = "rigbase-role"
NETWORK_TAG_SUFFIX = "node"

# a fixed namespace: requestIds must be the same across processes and versions for the same ids
REQUEST_ID_NAMESPACE = uuid.UUID("5b0b7f5e-7d43-4f4e-9a53-2f1d0c6a8e11")

_LABEL_OK = re.compile(r"[^a-z0-9_-]")


def gcp_name(*parts: str) -> str:
    """Join parts into a valid resource name; over-long names keep a hash suffix so they stay unique."""
    name = re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")
    if len(name) > 63:
        digest = hashlib.sha256(name.encode()).hexdigest()[:8]
        name = f"{name[:54].rstrip('-')}-{digest}"
    return name


def label_value(value: str) -> str:
    """Label values: ≤ 63 chars of lowercase letters, digits, '_' and '-'."""
    return _LABEL_OK.sub("-", value.lower())[:63]


def labels(prefix: str, **extra: str) -> dict[str, str]:
    base = {MANAGED_LABEL: label_value(prefix)}
    base.update({k: label_value(v) for k, v in extra.items()})
    return base


def request_id(*ids: str) -> str:
    """A Compute requestId (a UUID) derived from our own ids: a retry after a crash sends the same one,
    so Compute answers with the original operation instead of creating a second resource."""
    return str(uuid.uuid5(REQUEST_ID_NAMESPACE, "/".join(ids)))


def network_tag(prefix: str) -> str:
    return gcp_name(prefix, NETWORK_TAG_SUFFIX)
