"""The console's data page: the signed-in account's datasets, models and checkpoints, and the public ones,
read with the function GET /v1/datasets (…/models, …/checkpoints) calls (services/objects/data_objects.py),
one project at a time (?project=NAME; the default project otherwise). Creating one is the CLI's: a local
directory is uploaded from the user's own machine (docs/data.md)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from contracts.data_objects import ObjectKind
from provisioner.api.console.forms import SignedIn
from provisioner.api.console.render import ConsoleRoute, page, reading
from provisioner.services.accounts import accounts, projects
from provisioner.services.objects import data_objects

router = APIRouter(include_in_schema=False, route_class=ConsoleRoute)


@router.get("/data", response_class=HTMLResponse)
def data(request: Request, who: SignedIn) -> Response:
    wanted = request.query_params.get("project") or None
    with reading(request) as session:
        project = accounts.project_for(session, who.principal, wanted)  # NotFound: 404 as everywhere
        rows = {
            kind: data_objects.list_objects(session, who.principal, kind, project=project.id)
            for kind in ObjectKind
        }
        return page(
            request,
            "data.html",
            who,
            project=project,
            projects=projects.list_all(session, who.principal.account_id),
            rows=rows,
            names={
                r.project_id: data_objects.project_name(session, r) for kind in rows.values() for r in kind
            },
        )
