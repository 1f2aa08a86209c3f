"""The image builder's one error type: a message that says what to do next."""

from __future__ import annotations


class BuildError(Exception):
    """A build step refused or failed; str(error) is one sentence for the operator."""
