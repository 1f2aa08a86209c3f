"""Path convertors the routes use, registered with Starlette on import (before any route names them)."""

from __future__ import annotations

from starlette.convertors import Convertor, register_url_convertor


class _AnyPath(Convertor[str]):
    """Starlette's `path` (`.*`) stops at a newline, so `GET /v1/projects/a%0Ab` matched only
    `DELETE /{ref}` (`[^/]+` takes a newline) and answered an undocumented 405 (found by fuzzing). A ref
    may hold a `/` (`OWNER/PROJECT`) and, decoded, any character; the service answers 404 for a ref that
    names nothing."""

    regex = "(?s:.*)"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("anypath", _AnyPath())
