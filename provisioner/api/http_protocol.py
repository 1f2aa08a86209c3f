"""uvicorn's httptools protocol, letting go of a request once its answer is sent.

uvicorn keeps a connection's last request (its scope, the app's objects in it, the request cycle and its
event) until the next request on that connection arrives. A minion's connection is idle 30 s between two
beats, so every beat's objects outlived many young-generation collections, were promoted, and were then
walked by every older collection: with 10,000 minions holding connections, those collections paused the
one event loop for 100 to 240 ms (bench fleet_heartbeats, with the collector's callbacks logging). Here a
finished request is dropped at once, so its objects die young, by reference counting.

It is dropped only when nothing can still need it: its answer is sent, its body was read whole (an app
that answers before the body arrives keeps it, as uvicorn does), and no pipelined request waits."""

from __future__ import annotations

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

#: The `http` uvicorn loads (a string, so that `--workers` processes import it themselves)
HTTP_PROTOCOL = f"{__name__}:HttpProtocol"


class HttpProtocol(HttpToolsProtocol):
    def on_response_complete(self) -> None:
        super().on_response_complete()
        cycle = self.cycle
        if cycle is not None and cycle.response_complete and not cycle.more_body and not self.pipeline:
            self.cycle = None  # type: ignore[assignment]
            # the next request's, when its head is arriving already (a pipelining client), is kept
            if self.scope is cycle.scope:
                self.scope = None  # type: ignore[assignment]
