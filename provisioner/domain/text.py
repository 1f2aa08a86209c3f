"""Untrusted text made safe to store and print: one line, bounded.

Refusal reasons and audit lines quote what a client sent (a field path, a minion_id). A newline in it
would print a forged line in `provision node refusals`, and a megabyte in it would store a megabyte per
refused request, so every such string goes through `printable()` first."""

from __future__ import annotations

from typing import Final

# Enough for any field path or identifier a well-formed client sends; an attacker's key is cut here.
UNTRUSTED_MAX: Final = 300


def printable(text: str, limit: int = UNTRUSTED_MAX) -> str:
    """`text` with every non-printable character (newline, tab, ESC, …) as its repr escape (`\\n`,
    `\\x1b`) and cut to `limit` characters with a marker saying how much was dropped."""
    escaped = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)
    if len(escaped) <= limit:
        return escaped
    return f"{escaped[:limit]}…(+{len(escaped) - limit} chars)"
