"""HTTP client of the operator API. Where to connect: the settings' `url` / `token` (RIGBASE_URL /
RIGBASE_TOKEN), else the client config that `provision serve` writes in the home (mode 0600). Every
failure is one ControlPlaneError (provisioner/client/errors.py)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from provisioner.client.errors import ControlPlaneError
from provisioner.settings import Settings


def write_client_config(url: str, token: str, path: Path) -> Path:
    """Write URL + token readable by the owner only (created 0600, never world-readable in between)."""
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"url": url, "token": token}, f)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path


def read_client_config(path: Path) -> dict[str, str]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ControlPlaneError(
            f"client config {path} is unreadable ({exc}): delete it and restart `provision serve`"
        ) from exc


class Client:
    """The operator API over HTTP: JSON in, JSON out, the admin (or operator) token as a bearer."""

    def __init__(self, url: str, token: str | None, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    @classmethod
    def from_settings(cls, settings: Settings) -> Client:
        """Where the settings point: their url and token when both are set, else the client config."""
        given = settings.token.get_secret_value() if settings.token else None
        saved = read_client_config(settings.client_config) if not (settings.url and given) else {}
        url = settings.url or saved.get("url")
        token = given or saved.get("token")
        if not url:
            raise ControlPlaneError(
                f"no control plane configured: start one with `provision serve` (it "
                f"writes {settings.client_config}) or set RIGBASE_URL and RIGBASE_TOKEN"
            )
        return cls(url, token)

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ControlPlaneError(
                f"cannot reach the control plane at {self.url} ({type(exc).__name__}): "
                "start it with `provision serve` or fix RIGBASE_URL"
            ) from exc
        if response.is_success:
            return response.json()
        try:
            body = response.json()
            code, message = body["code"], body["message"]
        except (ValueError, KeyError, TypeError):
            code = "http_error"
            message = f"the control plane answered HTTP {response.status_code}: see its log"
        raise ControlPlaneError(message, code=code, status=response.status_code)

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, body: dict[str, Any], **params: Any) -> Any:
        return self.request(
            "POST", path, json=body, params={k: v for k, v in params.items() if v is not None}
        )

    def delete(self, path: str, **params: Any) -> Any:
        return self.request("DELETE", path, params={k: v for k, v in params.items() if v is not None})

    def pages(self, path: str, page_size: int = 500, **params: Any) -> Iterator[dict[str, Any]]:
        """Every item of a paginated list, following `next` cursors."""
        after: str | None = None
        while True:
            page = self.get(path, limit=page_size, after=after, **params)
            yield from page["items"]
            after = page.get("next")
            if not after:
                return
