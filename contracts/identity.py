"""Identities every program derives or checks the same way (docs/join-protocol.md "Identity").

A minion is named by its TPM: minion_id = the first 32 lowercase hex characters of SHA-256 over the DER
SubjectPublicKeyInfo of its endorsement key. Region, node and reservation host names are DNS labels,
because they become hostnames and mDNS labels. The checks use `re.fullmatch`: `re.match` with `$`
accepts a trailing newline, which would let "name\\n" through."""

from __future__ import annotations

import hashlib
import re

MINION_ID_LENGTH = 32
MINION_ID_PATTERN = r"[0-9a-f]{32}"
DNS_LABEL_PATTERN = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"

_MINION_ID = re.compile(MINION_ID_PATTERN)
_DNS_LABEL = re.compile(DNS_LABEL_PATTERN)


def minion_id_from_spki(spki_der: bytes) -> str:
    """minion_id: first 32 lowercase hex characters of SHA-256 over the EK's DER SubjectPublicKeyInfo."""
    return hashlib.sha256(spki_der).hexdigest()[:MINION_ID_LENGTH]


def is_minion_id(value: str) -> bool:
    return _MINION_ID.fullmatch(value) is not None


def is_dns_label(value: str) -> bool:
    """1-63 lowercase letters, digits and hyphens, starting and ending with a letter or digit."""
    return _DNS_LABEL.fullmatch(value) is not None
