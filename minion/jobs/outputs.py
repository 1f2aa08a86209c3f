"""A worker's own /opt/ml/output, sent to the control plane when the worker ends (docs/data.md, "Outputs").

The directory is cut into chunks by the same rule as every object (contracts/object_tree.py); the control
plane is asked which it lacks, those go up one by one over the minion's outbound connection with the node
credential, then the manifest. The worker's log is closed only after that (minion/jobs/worker.py), so the
control plane keeps the worker in the node's desired state until its output is in. An upload cut short is
sent again from what the control plane still lacks."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from contracts.data_objects import OUTPUT_ROUTE, Manifest
from contracts.object_tree import scan
from minion.join.client import ConnectionProblem, ControlPlane

log = logging.getLogger(__name__)


class OutputUnavailable(Exception):
    """The control plane cannot take it now: try again later."""


class OutputRefused(Exception):
    """The control plane does not want it (the worker is not known there): drop it."""


class OutputSink(Protocol):
    def missing(self, job_id: str, worker: int, chunks: list[str]) -> list[str]: ...

    def put(self, job_id: str, worker: int, sha256: str, data: bytes) -> None: ...

    def finish(self, job_id: str, worker: int, manifest: Manifest) -> None: ...


@dataclass
class ControlPlaneOutputs:
    """OutputSink over the minion's own connection, with the node credential."""

    cp: ControlPlane
    node: Callable[[], dict[str, Any]]

    def _send(self, method: str, job_id: str, worker: int, tail: str, **body: Any) -> Any:
        node = self.node()
        path = OUTPUT_ROUTE.format(node_id=node["node_id"], job_id=job_id, worker=worker) + tail
        try:
            answer = self.cp.send(method, path, node["node_credential"], **body)
        except ConnectionProblem as exc:
            raise OutputUnavailable(str(exc)) from None
        if answer.status_code in (404, 410):
            raise OutputRefused(answer.text[:200])
        if answer.status_code >= 400:
            raise OutputUnavailable(f"HTTP {answer.status_code}: {answer.text[:200]}")
        return answer.json() if answer.content else None

    def missing(self, job_id: str, worker: int, chunks: list[str]) -> list[str]:
        answer = self._send("POST", job_id, worker, "/missing", json={"chunks": chunks})
        return list(answer["missing"])

    def put(self, job_id: str, worker: int, sha256: str, data: bytes) -> None:
        headers = {"Content-Type": "application/octet-stream"}
        self._send("PUT", job_id, worker, f"/chunks/{sha256}", content=data, headers=headers)

    def finish(self, job_id: str, worker: int, manifest: Manifest) -> None:
        self._send("POST", job_id, worker, "/manifest", json=manifest.model_dump(mode="json"))


def upload(sink: OutputSink, job_id: str, worker: int, root: Path) -> str:
    """Send what `root` holds (what the control plane lacks of it); the output's digest."""
    tree = scan(root)
    order = list(tree.pieces)
    wanted = set(sink.missing(job_id, worker, order))
    for sha in order:
        if sha in wanted:
            sink.put(job_id, worker, sha, tree.pieces[sha].read())
    sink.finish(job_id, worker, tree.manifest)
    log.info(
        "output of %s/%d sent: %d files, %d bytes",
        job_id,
        worker,
        len(tree.manifest.files),
        tree.manifest.size,
    )
    return tree.manifest.digest()
