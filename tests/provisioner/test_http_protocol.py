"""The HTTP protocol `provision serve` runs (provisioner/api/http_protocol.py), in a real uvicorn on
uvloop: a finished request's objects are freed while its connection stays open, and keep-alive,
pipelining and an answer sent before its body arrived behave as uvicorn's own protocol."""

from __future__ import annotations

import gc
import logging
import socket
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from provisioner.api.http_protocol import HTTP_PROTOCOL, HttpProtocol


class Probe:
    """An object the app leaves in a request's scope, as FastAPI leaves its own there."""


class App:
    def __init__(self) -> None:
        self.probes: list[weakref.ref[Probe]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        probe = Probe()
        scope["probe"] = probe
        self.probes.append(weakref.ref(probe))
        if scope["path"] == "/early":  # answers before reading its body
            status, body = 413, b"too large"
        else:
            received = b""
            while True:
                message = await receive()
                received += message.get("body", b"")
                if not message.get("more_body"):
                    break
            status, body = 200, b"%s %d" % (scope["path"].encode(), len(received))
        headers = [(b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[int, App, uvicorn.Server]]:
    app = App()
    listening = socket.create_server(("127.0.0.1", 0))
    config = uvicorn.Config(
        app, http=HTTP_PROTOCOL, loop="uvloop", log_level="warning", timeout_keep_alive=60
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listening]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started
    yield listening.getsockname()[1], app, server
    server.should_exit = True
    thread.join(10)
    listening.close()


def _read_answers(conn: socket.socket, count: int) -> list[bytes]:
    """`count` answers (status line to body, by Content-Length) from `conn`."""
    data, answers = b"", []
    while len(answers) < count:
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
        while b"\r\n\r\n" in data:
            head, rest = data.split(b"\r\n\r\n", 1)
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            if len(rest) < length:
                break
            answers.append(head.split(b"\r\n", 1)[0] + b" | " + rest[:length])
            data = rest[length:]
    return answers


def _post(path: str, body: bytes) -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%s" % (path.encode(), len(body), body)


def _protocols(server: uvicorn.Server) -> list[HttpProtocol]:
    return [c for c in server.server_state.connections if isinstance(c, HttpProtocol)]


def test_a_finished_request_is_freed_while_its_connection_stays_open(
    served: tuple[int, App, uvicorn.Server],
) -> None:
    port, app, server = served
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(_post("/one", b"abc"))
        assert _read_answers(conn, 1) == [b"HTTP/1.1 200 OK | /one 3"]
        time.sleep(0.2)  # the request's task ends after its answer
        gc.disable()  # freed by reference counting, not found by a collection
        try:
            assert app.probes[-1]() is None, "the connection still holds its finished request's scope"
        finally:
            gc.enable()
        held = _protocols(server)
        assert len(held) == 1 and held[0].cycle is None
        conn.sendall(_post("/two", b"hello"))  # the same connection, kept alive
        assert _read_answers(conn, 1) == [b"HTTP/1.1 200 OK | /two 5"]


def test_pipelined_requests_are_answered_in_order(served: tuple[int, App, uvicorn.Server]) -> None:
    port, _, _ = served
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(_post("/a", b"1") + _post("/b", b"22") + _post("/c", b"333"))
        assert _read_answers(conn, 3) == [
            b"HTTP/1.1 200 OK | /a 1",
            b"HTTP/1.1 200 OK | /b 2",
            b"HTTP/1.1 200 OK | /c 3",
        ]


def test_an_answer_before_the_body_arrived_keeps_the_request_until_its_body_is_read(
    served: tuple[int, App, uvicorn.Server], caplog: pytest.LogCaptureFixture
) -> None:
    port, _, server = served
    caplog.set_level(logging.ERROR)
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(b"POST /early HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n12345")
        assert _read_answers(conn, 1) == [b"HTTP/1.1 413 Request Entity Too Large | too large"]
        assert _protocols(server)[0].cycle is not None  # its body is still arriving
        conn.sendall(b"67890" + _post("/after", b"xy"))
        assert _read_answers(conn, 1) == [b"HTTP/1.1 200 OK | /after 2"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_a_pipelined_request_whose_head_arrives_in_pieces_is_answered(
    served: tuple[int, App, uvicorn.Server], caplog: pytest.LogCaptureFixture
) -> None:
    """The next request's head begins before the answer to the one before is sent: its scope is the
    protocol's by then, and letting go of the finished request must leave it."""
    port, _, _ = served
    caplog.set_level(logging.ERROR)
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(_post("/first", b"1") + b"POST /second HTTP/1.1\r\nHost: t\r\n")
        assert _read_answers(conn, 1) == [b"HTTP/1.1 200 OK | /first 1"]
        conn.sendall(b"Content-Length: 2\r\n\r\nzz")
        assert _read_answers(conn, 1) == [b"HTTP/1.1 200 OK | /second 2"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
