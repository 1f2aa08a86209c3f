"""A client TLS context that resumes its last TLS 1.3 session when it must open a new connection.

httpx (through httpcore) never hands a session back to `wrap_socket`, so without this every reconnect of
the minion to the control plane is a full handshake: the server signs with its key, the minion checks the
chain. `ResumingContext` keeps the newest session ticket the server sent on any of its connections and
offers it on the next one; a ticket the server no longer accepts (rotated key, another control-plane host,
a restart) costs nothing but the full handshake that would have happened anyway. Resumption keeps the
ECDHE exchange (OpenSSL offers psk_dhe_ke only), so each connection keeps its own forward secrecy.

The same context serves a blocking socket (httpx's `wrap_socket`) and an asyncio stream (`wrap_bio`), so
the fleet benchmark's client resumes exactly as a minion does (bench/beat_client.py)."""

from __future__ import annotations

import socket
import ssl
import threading
from dataclasses import dataclass
from typing import Any


@dataclass
class TlsCounts:
    """What the context did: connections it opened and how many of them resumed a session."""

    connections: int = 0
    resumed: int = 0


class _KeepingSocket(ssl.SSLSocket):
    """Hands its session to its context as it closes: TLS 1.3 tickets arrive after the handshake, so the
    newest one is only known once the connection has carried its requests."""

    def close(self) -> None:
        context = self.context
        if isinstance(context, ResumingContext) and not self._closed:  # type: ignore[attr-defined]
            context.keep(self.session)
        super().close()


class ResumingContext(ssl.SSLContext):
    """`ssl.create_default_context` for a client (the CA given, or the system's store), resuming."""

    sslsocket_class = _KeepingSocket

    def __new__(cls, cadata: str | None = None) -> ResumingContext:
        return super().__new__(cls, ssl.PROTOCOL_TLS_CLIENT)

    def __init__(self, cadata: str | None = None) -> None:
        # PROTOCOL_TLS_CLIENT already checks the host name and requires a verified chain
        if cadata:
            self.load_verify_locations(cadata=cadata)
        else:
            self.load_default_certs(ssl.Purpose.SERVER_AUTH)
        self.counts = TlsCounts()
        self._session: ssl.SSLSession | None = None
        self._lock = threading.Lock()

    def keep(self, session: ssl.SSLSession | None) -> None:
        """Offer `session` on the next connection, if the server gave it a ticket to resume with."""
        if session is not None and session.has_ticket:
            with self._lock:
                self._session = session

    def note(self, tls: ssl.SSLSocket | ssl.SSLObject) -> None:
        """Count a connection whose handshake is done (the asyncio side counts after its first answer)."""
        with self._lock:
            self.counts.connections += 1
            self.counts.resumed += bool(tls.session_reused)

    def wrap_socket(
        self,
        sock: socket.socket,
        server_side: bool = False,
        do_handshake_on_connect: bool = True,
        suppress_ragged_eofs: bool = True,
        server_hostname: str | bytes | None = None,
        session: ssl.SSLSession | None = None,
    ) -> ssl.SSLSocket:
        tls = super().wrap_socket(
            sock,
            server_side=server_side,
            do_handshake_on_connect=do_handshake_on_connect,
            suppress_ragged_eofs=suppress_ragged_eofs,
            server_hostname=server_hostname,
            session=session or self._offer(),
        )
        if do_handshake_on_connect and not server_side:
            self.note(tls)
        return tls

    def wrap_bio(
        self,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
        server_side: bool = False,
        server_hostname: str | bytes | None = None,
        session: ssl.SSLSession | None = None,
    ) -> ssl.SSLObject:
        return super().wrap_bio(
            incoming,
            outgoing,
            server_side=server_side,
            server_hostname=server_hostname,
            session=session or self._offer(),
        )

    def _offer(self) -> ssl.SSLSession | None:
        with self._lock:
            return self._session


def keep_from(context: Any, tls: Any) -> None:
    """Keep the session of an asyncio connection's SSLObject (`writer.get_extra_info('ssl_object')`)
    before it closes; nothing for a context that does not resume."""
    if isinstance(context, ResumingContext) and tls is not None:
        context.keep(tls.session)
