"""The node's outbound tunnel (docs/job-urls.md): how a job's URL and `provision job connect` reach a worker
on a node that never accepts a connection.

The minion keeps one WebSocket open to TUNNEL_ROUTE, with its node credential. When the control plane
needs a TCP connection to a worker's port it sends one StreamOpen on it; the minion dials the worker's
container and opens a second WebSocket, STREAM_ROUTE for that stream id, whose binary messages are the
connection's bytes both ways. The WebSocket library frames the bytes; nothing here frames them again. One
TCP connection is one stream WebSocket, so a slow download never holds up another connection.

A stream the minion cannot serve is opened and closed at once with one of the CLOSE_* codes (RFC 6455
keeps 4000-4999 for applications), and the reason says why in one line."""

from __future__ import annotations

from typing import Annotated, Final

from pydantic import Field

from contracts.jobs import JobId, WorkerNumber
from contracts.messages import ControlPlaneMessage

TUNNEL_ROUTE: Final = "/v1/nodes/{node_id}/tunnel"
STREAM_ROUTE: Final = "/v1/nodes/{node_id}/tunnel/streams/{stream_id}"
JOB_URL_PATH: Final = "/j/{job_id}/"  # a notebook's or endpoint's URL on the control plane

StreamId = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{22,64}$")]

CLOSE_NOT_HERE: Final = 4404  # no running worker of that job on this node
CLOSE_UNREACHABLE: Final = 4502  # nothing answers on the worker's port
CLOSE_REFUSED: Final = 4403  # a port the node does not let the tunnel reach


class StreamOpen(ControlPlaneMessage):
    """One TCP connection the control plane wants to `port` of a worker's container on this node."""

    stream_id: StreamId
    job_id: JobId
    worker: WorkerNumber
    port: int = Field(ge=1, le=65535)
