"""TLS session tickets and resumption between real sockets: the server's rotating ticket key
(provisioner/adapters/tls.py) and the minion's resuming context (minion/join/tls_resume.py), and the idle
times of the two sides, which must leave every close of a beat's connection to the minion."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from minion.join.client import beat_idle_s
from minion.join.tls_resume import ResumingContext, TlsCounts
from provisioner.adapters.tls import RotatingTickets, TlsFiles, ensure_ca, ensure_server_cert
from provisioner.api.tuning import keep_alive_s


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[int, RotatingTickets, str]]:
    """A TLS server on loopback answering `hello` to each connection, its context rotating every 0.5 s."""
    files = TlsFiles(tmp_path / "tls")  # a CA of its own: not the session's, which SSL_CERT_FILE names
    files.dir.mkdir(mode=0o700)
    ensure_ca(files)
    ensure_server_cert(files, ["127.0.0.1"])

    def make() -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(files.cert, files.key)
        return context

    context = RotatingTickets(make, every_s=0.5)
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                raw, _ = listener.accept()
            except OSError:
                return
            try:
                with context.wrap_socket(raw, server_side=True) as tls:
                    tls.recv(16)
                    tls.sendall(b"hello")
            except ssl.SSLError:  # a client that refused the certificate
                raw.close()

    threading.Thread(target=serve, daemon=True).start()
    yield listener.getsockname()[1], context, files.ca_cert.read_text()
    listener.close()


def _connect(client: ResumingContext, port: int) -> bool:
    with client.wrap_socket(
        socket.create_connection(("127.0.0.1", port)), server_hostname="127.0.0.1"
    ) as tls:
        tls.sendall(b"x")
        assert tls.recv(16) == b"hello"
        while tls.recv(16):  # the server's close: its tickets have arrived
            pass
        return tls.session_reused


def test_a_new_connection_resumes_until_the_ticket_key_rotates(
    server: tuple[int, RotatingTickets, str],
) -> None:
    port, context, ca = server
    client = ResumingContext(ca)
    resumed = [_connect(client, port) for _ in range(3)]
    time.sleep(0.6)  # the key rotates: the ticket the client holds opens nothing
    resumed += [_connect(client, port), _connect(client, port)]
    assert resumed == [False, True, True, False, True]
    assert context.rotations == 1 and client.counts == TlsCounts(connections=5, resumed=3)


def test_a_context_that_trusts_another_ca_still_refuses_the_server(
    server: tuple[int, RotatingTickets, str],
) -> None:
    port, _, _ = server
    with pytest.raises(ssl.SSLCertVerificationError):
        _connect(ResumingContext(None), port)  # the default store (the session CA here): not this one


@pytest.mark.parametrize("interval_s", [1, 5, 30, 120, 600])
def test_the_minion_closes_a_beats_idle_connection_before_the_server_would(interval_s: float) -> None:
    assert interval_s < beat_idle_s(interval_s) < keep_alive_s(interval_s)
