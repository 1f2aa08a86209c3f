"""The node's outbound tunnel (contracts/tunnel.py, docs/job-urls.md): how a notebook's or endpoint's URL,
and `provision job connect`, reach a worker's port on a node that never accepts a connection.

One thread keeps a WebSocket open to the control plane (its TUNNEL_ROUTE, with the node credential) and
reconnects by itself, with backoff, after a control-plane restart or a network cut. Each StreamOpen it
receives gets a thread of its own: it dials the worker's container (JobsAgent says where; nothing else on
the node is reachable), then opens the stream's WebSocket and copies bytes both ways until either side
closes. The websockets library frames the bytes, pings the connection and enforces message sizes."""

from __future__ import annotations

import logging
import random
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from pydantic import ValidationError
from websockets.exceptions import ConnectionClosed, WebSocketException
from websockets.sync.client import ClientConnection, connect

from contracts.tunnel import (
    CLOSE_NOT_HERE,
    CLOSE_UNREACHABLE,
    STREAM_ROUTE,
    TUNNEL_ROUTE,
    StreamOpen,
)

log = logging.getLogger(__name__)

CHUNK: Final = 64 * 1024  # one read of the worker's socket is one binary message
DIAL_TIMEOUT_S: Final = 5.0
OPEN_TIMEOUT_S: Final = 10.0
PING_S: Final = 20.0  # a cut network is noticed within about twice this
BACKOFF_S: Final = (0.5, 30.0)  # the first retry, the longest wait between tries


class NotHere(Exception):
    """No running worker of that job on this node."""


Dial = Callable[[StreamOpen], tuple[str, int]]  # where a stream's bytes go, or NotHere


def websocket_url(control_plane_url: str, path: str) -> str:
    base = control_plane_url.rstrip("/")
    if base.startswith("https://"):
        return "wss://" + base[len("https://") :] + path
    if base.startswith("http://"):
        return "ws://" + base[len("http://") :] + path
    raise ValueError(f"the control plane's URL {control_plane_url!r} is neither https:// nor http://")


@dataclass
class Tunnel:
    control_plane_url: str
    node: Callable[[], dict[str, Any]]  # node.json as the run loop keeps it (node_id, node_credential)
    dial: Dial
    ssl_context: ssl.SSLContext | None = None
    closing: threading.Event = field(default_factory=threading.Event)
    connected: threading.Event = field(default_factory=threading.Event)
    streams: int = 0  # streams served since start (for the tests and the log)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tunnel", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.closing.set()
        if self._thread is not None:
            self._thread.join(5)

    def _connect(self, path: str) -> ClientConnection:
        node = self.node()
        return connect(
            websocket_url(self.control_plane_url, path.format(node_id=node["node_id"])),
            additional_headers={"Authorization": f"Bearer {node['node_credential']}"},
            ssl=self.ssl_context if self.control_plane_url.startswith("https://") else None,
            open_timeout=OPEN_TIMEOUT_S,
            ping_interval=PING_S,
            ping_timeout=PING_S,
            max_size=2 * CHUNK,
            compression=None,  # the bytes are often compressed already; deflate costs both ends CPU
        )

    def _run(self) -> None:
        wait = BACKOFF_S[0]
        while not self.closing.is_set():
            try:
                with self._connect(TUNNEL_ROUTE) as ws:
                    self.connected.set()
                    wait = BACKOFF_S[0]
                    self._serve(ws)
            except (OSError, TimeoutError, WebSocketException) as exc:
                log.info("tunnel: %s: %s; retrying in %.1f s", type(exc).__name__, exc, wait)
            except Exception:  # one bad answer must not end the node's only tunnel
                log.exception("tunnel: unexpected failure; retrying in %.1f s", wait)
            self.connected.clear()
            if self.closing.wait(wait * random.uniform(0.5, 1.0)):
                return
            wait = min(BACKOFF_S[1], wait * 2)

    def _serve(self, ws: ClientConnection) -> None:
        while not self.closing.is_set():
            try:
                message = ws.recv(timeout=1.0)
            except TimeoutError:
                continue
            try:
                opening = StreamOpen.model_validate_json(message)
            except ValidationError as exc:
                log.warning("tunnel: an unreadable stream request (%d problems)", exc.error_count())
                continue
            self.streams += 1
            threading.Thread(target=self._stream, args=(opening,), name="tunnel-stream", daemon=True).start()

    def _stream(self, opening: StreamOpen) -> None:
        refusal: tuple[int, str] | None = None
        sock: socket.socket | None = None
        try:
            sock = socket.create_connection(self.dial(opening), timeout=DIAL_TIMEOUT_S)
            sock.settimeout(None)
        except NotHere as exc:
            refusal = (CLOSE_NOT_HERE, str(exc))
        except OSError as exc:
            refusal = (CLOSE_UNREACHABLE, f"nothing answers on port {opening.port} ({exc.strerror or exc})")
        try:
            with self._connect(STREAM_ROUTE.replace("{stream_id}", opening.stream_id)) as ws:
                if sock is None:
                    assert refusal is not None
                    ws.close(*refusal)
                    return
                _pump(ws, sock)
        except (OSError, TimeoutError, WebSocketException) as exc:
            log.info("tunnel stream %s: %s", opening.stream_id[:8], exc)
        finally:
            if sock is not None:
                sock.close()


def _pump(ws: ClientConnection, sock: socket.socket) -> None:
    """Bytes both ways until either side ends; then both end (a WebSocket has no half-close)."""

    def upstream() -> None:  # the worker's bytes to the control plane
        try:
            while data := sock.recv(CHUNK):
                ws.send(data)
        except (OSError, ConnectionClosed):
            pass
        finally:
            ws.close()

    reader = threading.Thread(target=upstream, name="tunnel-up", daemon=True)
    reader.start()
    try:
        for message in ws:
            sock.sendall(message if isinstance(message, bytes) else message.encode())
    except (OSError, ConnectionClosed):
        pass
    finally:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        reader.join(5)
