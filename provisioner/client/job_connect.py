"""`provision job connect`'s client side (docs/job-urls.md): a local TCP port whose every connection is
one WebSocket to the control plane's /v1/jobs/REF/connect, which the node's tunnel carries to the
worker's port. As `kubectl port-forward`: local connections only, one stream each, bytes both ways."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final
from urllib.parse import quote

from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException
from websockets.sync.client import ClientConnection, connect

CHUNK: Final = 64 * 1024


@dataclass(frozen=True)
class Forward:
    url: str  # the control plane's https:// URL
    token: str
    ssl_context: ssl.SSLContext | None
    ref: str  # the job's name or id
    remote: int

    def websocket(self) -> ClientConnection:
        base = (
            "wss://" + self.url.removeprefix("https://")
            if self.url.startswith("https://")
            else ("ws://" + self.url.removeprefix("http://"))
        )
        return connect(
            f"{base}/v1/jobs/{quote(self.ref, safe='')}/connect?port={self.remote}",
            additional_headers={"Authorization": f"Bearer {self.token}"},
            ssl=self.ssl_context if self.url.startswith("https://") else None,
            open_timeout=15,
            max_size=2 * CHUNK,
            compression=None,
        )


def serve(forward: Forward, listener: socket.socket, report: Callable[[str], None]) -> None:
    """Accept local connections until interrupted; each is carried on a thread of its own."""
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_carry, args=(forward, conn, report), daemon=True).start()


def _carry(forward: Forward, conn: socket.socket, report: Callable[[str], None]) -> None:
    try:
        ws = forward.websocket()
    except InvalidStatus as exc:
        report(f"refused: HTTP {exc.response.status_code}")
        conn.close()
        return
    except (OSError, WebSocketException) as exc:
        report(f"cannot reach the control plane: {exc}")
        conn.close()
        return

    def to_worker() -> None:
        try:
            while data := conn.recv(CHUNK):
                ws.send(data)
        except (OSError, ConnectionClosed):
            pass
        finally:
            ws.close()

    sender = threading.Thread(target=to_worker, daemon=True)
    sender.start()
    try:
        for message in ws:
            conn.sendall(message if isinstance(message, bytes) else message.encode())
    except (OSError, ConnectionClosed):
        pass
    finally:
        if ws.close_code not in (None, 1000) and ws.close_reason:
            report(ws.close_reason)
        try:
            conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        conn.close()
        sender.join(5)
