"""Whether a notebook's or endpoint's server answers (contracts/jobs.py ServeBinding): the worker is
running only once GET on its health path answers below 500; until then it is starting, and its message
says what the last try found. And how long a notebook has been idle, as Jupyter itself says, for the
job's autostop (docs/job-urls.md, "Autostop")."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Final

import httpx

from contracts.jobs import ServeBinding

CHECK_TIMEOUT_S: Final = 2.0


def waiting(serve: ServeBinding, found: str) -> str:
    return f"waiting for its server to answer GET {serve.health_path} on port {serve.port} ({found})"


def check(address: str, serve: ServeBinding) -> str | None:
    """None when the server answers below 500; else the starting message."""
    try:
        answer = httpx.get(_url(address, serve.port, serve.health_path), timeout=CHECK_TIMEOUT_S)
    except httpx.ConnectError:
        return waiting(serve, "nothing listens yet")
    except httpx.HTTPError as exc:
        return waiting(serve, type(exc).__name__)
    if answer.status_code >= 500:
        return waiting(serve, f"it answered HTTP {answer.status_code}")
    return None


def _url(address: str, port: int, path: str) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}{path}"


def notebook_idle_s(address: str, serve: ServeBinding, token: str | None, now: datetime) -> float | None:
    """Seconds since Jupyter's last activity: 0 while a connection is open or a kernel is busy; None when
    Jupyter does not say (not a notebook, not answering, an unreadable answer)."""
    if serve.status_path is None:
        return None
    headers = {"Authorization": f"token {token}"} if token else {}
    try:
        status = httpx.get(
            _url(address, serve.port, serve.status_path), headers=headers, timeout=CHECK_TIMEOUT_S
        )
        kernels = httpx.get(
            _url(address, serve.port, serve.status_path.removesuffix("status") + "kernels"),
            headers=headers,
            timeout=CHECK_TIMEOUT_S,
        )
        if status.status_code != 200 or kernels.status_code != 200:
            return None
        state, running = status.json(), kernels.json()
        if int(state.get("connections") or 0) > 0:
            return 0.0
        if any(k.get("execution_state") == "busy" for k in running):
            return 0.0
        last = datetime.fromisoformat(str(state["last_activity"]).replace("Z", "+00:00"))
    except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return max(0.0, (now - last.astimezone(UTC)).total_seconds())
