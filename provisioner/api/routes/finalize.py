"""Minion routes of on-node finalize (docs/join-protocol.md, "Finalize"), node credential auth: download the
playbook bundle a heartbeat answer's finalize work names, and report a run's task events and outcome."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from contracts.finalize import BUNDLE_MEDIA_TYPE, BUNDLE_ROUTE, REPORT_ROUTE, FinalizeReport
from provisioner.api.deps import Db, NodeCredential
from provisioner.api.errors import NODE_ERRORS, documented
from provisioner.api.schemas import FinalizeReportOut
from provisioner.services.fleet import finalize as service
from provisioner.services.fleet import finalize_bundle, node_credentials

router = APIRouter(tags=["finalize"])


@router.get(
    BUNDLE_ROUTE,
    response_class=Response,
    responses={
        200: {"content": {BUNDLE_MEDIA_TYPE: {}}, "description": "the playbook bundle (a gzip'd tar)"},
        **NODE_ERRORS,
        **documented(404),
    },
)
def bundle(digest: str, request: Request, session: Db, credential: NodeCredential) -> Response:
    """The playbook bundle with this SHA-256 (any joined node may fetch it); 404 for another digest."""
    node_credentials.any_node(session, credential)
    found = finalize_bundle.by_digest(request.app.state.settings.playbooks, digest)
    return Response(
        found.data,
        media_type=BUNDLE_MEDIA_TYPE,
        headers={"Cache-Control": "private, max-age=86400, immutable", "ETag": f'"{found.digest}"'},
    )


@router.post(REPORT_ROUTE, responses={**NODE_ERRORS, **documented(404, 409)})
def report(node_id: str, body: FinalizeReport, session: Db, credential: NodeCredential) -> FinalizeReportOut:
    """A run's task events and, once it ended, its outcome (409: not the node's current generation)."""
    return FinalizeReportOut(**service.record(session, node_id, credential, body))
