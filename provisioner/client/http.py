"""HTTP client of the operator API. Where to connect: the settings' `url` / `token` (RIGBASE_URL /
RIGBASE_TOKEN), else the client config that `provision serve` writes in the home (mode 0600). What to
trust: RIGBASE_CA_CERT, else the control-plane CA the client config names, whatever URL is used (only
that CA, not the system's trust store), else the system's (an operator's publicly trusted certificate).
Every failure is one ControlPlaneError (provisioner/client/errors.py)."""

from __future__ import annotations

import json
import os
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from provisioner.client.errors import ControlPlaneError
from provisioner.client_settings import ClientSettings


def write_client_config(url: str, token: str, path: Path, *, ca: str | None = None) -> Path:
    """Write URL + token (+ the CA file to trust) readable by the owner only (created 0600, never
    world-readable in between)."""
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"url": url, "token": token, **({"ca": ca} if ca else {})}, f)
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


def _nothing_configured(settings: ClientSettings) -> str:
    """Where to point the CLI: a running control plane's home when there is one, else how to start one."""
    from provisioner.client.homes import running_homes

    homes = [(home, pid) for home, pid in running_homes(settings.home) if home != settings.home]
    if homes:
        named = ", ".join(f"RIGBASE_HOME={home} (pid {pid})" for home, pid in homes[:5])
        return (
            f"no control plane configured in {settings.home}: one runs with {named}; "
            "set that RIGBASE_HOME, or RIGBASE_URL and RIGBASE_TOKEN"
        )
    return (
        f"no control plane configured: start one with `provision serve` (it writes "
        f"{settings.client_config}) or set RIGBASE_URL and RIGBASE_TOKEN"
    )


def client_context(ca: Path | None) -> ssl.SSLContext | bool:
    """What an httpx client verifies with: only `ca` when given, else the system's trust store. Here
    rather than in adapters/tls.py, which issues certificates: importing that one loads `cryptography`,
    ~50 ms of every CLI command's start."""
    return ssl.create_default_context(cafile=str(ca)) if ca is not None else True


class Client:
    """The operator API over HTTP: JSON in, JSON out, the admin (or operator) token as a bearer."""

    def __init__(self, url: str, token: str | None, timeout: float = 30.0, *, ca: Path | None = None) -> None:
        """`ca`: the only CA the server's certificate may chain to; None: the system's trust store."""
        self.url = url.rstrip("/")
        self.ca = ca
        self.token = token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            verify = client_context(ca)
        except (OSError, ssl.SSLError) as exc:
            raise ControlPlaneError(
                f"cannot use the CA certificate {ca} ({exc}): "
                "fix RIGBASE_CA_CERT or restart `provision serve`"
            ) from None
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, verify=verify)

    @classmethod
    def from_settings(cls, settings: ClientSettings) -> Client:
        """Where the settings point: their url and token when both are set, else the client config.
        The client config's CA is trusted whatever the URL (RIGBASE_CA_CERT replaces it)."""
        given = settings.token
        saved = (
            read_client_config(settings.client_config)
            if not (settings.url and given and settings.ca_cert)
            else {}
        )
        url = settings.url or saved.get("url")
        token = given or saved.get("token")
        if not url:
            raise ControlPlaneError(_nothing_configured(settings))
        # the URL and the CA are independent: RIGBASE_URL naming this home's control plane by another
        # address (a LAN name, an advertised IP) still trusts the home's CA, and only it
        saved_ca = saved.get("ca")
        ca = settings.ca_cert or (Path(saved_ca) if saved_ca else None)
        return cls(url, token, ca=ca)

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.ConnectError as exc:
            if "CERTIFICATE_VERIFY_FAILED" in str(exc):
                raise ControlPlaneError(
                    f"the control plane at {self.url} shows a certificate not from "
                    f"{self.ca or 'a CA this system trusts'}: check RIGBASE_URL / RIGBASE_CA_CERT "
                    "(an impostor, or another control plane)"
                ) from exc
            raise ControlPlaneError(
                f"cannot reach the control plane at {self.url} ({type(exc).__name__}): "
                "start it with `provision serve` or fix RIGBASE_URL"
            ) from exc
        except httpx.TransportError as exc:
            raise ControlPlaneError(
                f"cannot reach the control plane at {self.url} ({type(exc).__name__}): "
                "start it with `provision serve` or fix RIGBASE_URL"
            ) from exc
        if response.status_code == 204:
            return None
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

    def patch(self, path: str, body: dict[str, Any]) -> Any:
        return self.request("PATCH", path, json=body)

    def put(self, path: str, body: dict[str, Any]) -> Any:
        return self.request("PUT", path, json=body)

    def get_bytes(self, path: str) -> bytes:
        """A GET whose answer is raw bytes (a chunk); errors as `request` words them."""
        try:
            response = self.http.get(path)
        except httpx.TransportError:
            response = None
        if response is not None and response.is_success:
            return response.content
        self.request("GET", path)  # raises the refusal (or the unreachable server) in its own words
        raise ControlPlaneError(f"the control plane sent no bytes for {path}")

    def put_bytes(self, path: str, data: bytes) -> Any:
        return self.request("PUT", path, content=data, headers={"Content-Type": "application/octet-stream"})

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
