"""Input rules shared by every resource: DNS-label names and minion_ids, and what a reference by
name or id resolves to."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TypeVar

from contracts.errors import InvalidInput, NotFound
from contracts.identity import is_dns_label, is_minion_id

T = TypeVar("T")

# Checked with fullmatch, and \Z in the look-ahead: `$` would accept a trailing newline.
HOSTNAME = re.compile(
    r"(?=.{1,253}\Z)[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*"
)


def dns_label(kind: str, name: str) -> str:
    """Region and node names become hostnames and mDNS labels, so they must be DNS labels."""
    if not is_dns_label(name):
        raise InvalidInput(
            f"{kind} name {name!r} is not a DNS label: use 1-63 lowercase letters, digits and hyphens, "
            "starting and ending with a letter or digit",
            code="invalid_name",
        )
    return name


def minion_id(value: str) -> str:
    """minion_id = first 32 hex characters of SHA-256 over the TPM EK public key (contracts/identity.py)."""
    if not is_minion_id(value):
        raise InvalidInput(
            f"minion_id {value!r} is not 32 lowercase hex characters: copy it from the node's console banner",
            code="invalid_minion_id",
        )
    return value


def hostname(value: str) -> str:
    if not HOSTNAME.fullmatch(value):
        raise InvalidInput(
            f"hostname {value!r} is not a valid DNS name: use lowercase labels separated by dots"
        )
    return value


def one_named(
    found: Sequence[T], *, kind: str, ref: str, place: Callable[[T], str], scope: str, option: str
) -> T:
    """The one live row a name-or-id reference picks. A name is unique only within its scope (a node's
    region, a region's provider), so the same name in several scopes is refused listing them, with the
    option that disambiguates, instead of guessing."""
    if not found:
        raise NotFound(
            f"{kind} '{ref}' does not exist: see `provision {kind} list`", code=f"{kind}_not_found"
        )
    if len(found) > 1:
        where = ", ".join(sorted(place(row) for row in found))
        raise InvalidInput(f"{kind} name '{ref}' exists in several {scope} ({where}): pass {option}")
    return found[0]
