"""The console's data page: the signed-in account's datasets, models and checkpoints, and the public ones,
read with the function GET /v1/datasets (…/models, …/checkpoints) calls (services/objects/data_objects.py),
one project at a time (?project=NAME; the default project otherwise). Its form creates one from a remote
source (s3://, gs://, azure://, https://, git+https://) with the service POST /v1/datasets calls, and each
row's Remove asks first, then removes it as DELETE does. A local directory is the CLI's to upload: a
browser cannot send a directory's files as resumable, digest-checked chunks (docs/data.md)."""

from __future__ import annotations

from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response
from sqlalchemy.orm import Session

from contracts.data_objects import ObjectKind, SourceScheme, parse_source
from contracts.errors import InvalidInput
from provisioner.api.console.forms import Posted, SignedIn
from provisioner.api.console.render import ConsoleRoute, Done, page, perform, reading
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
            kinds=list(ObjectKind),
            names={
                r.project_id: data_objects.project_name(session, r) for kind in rows.values() for r in kind
            },
        )


def _back(project: str | None) -> str:
    return "/data" + (f"?project={quote(project)}" if project else "")


@router.post("/data")
def create(request: Request, posted: Posted) -> Response:
    """A new object from a remote source; it is `downloading` until the control plane has read it."""
    who, form = posted
    project = form.optional("project")

    def work(session: Session) -> Done:
        source = form.required("source", "source")
        if parse_source(source).scheme is SourceScheme.UPLOAD:
            raise InvalidInput(
                "a local path is uploaded from your machine: `provision dataset create NAME --source PATH`",
                code="invalid_source",
            )
        obj = data_objects.create(
            session,
            who.principal,
            form.required("kind", "kind"),
            form.required("name", "name"),
            source,
            project=project,
            endpoint_url=form.optional("endpoint_url"),
            key=form.optional("key"),
        )
        return Done(f"{obj.kind} {obj.name} created ({obj.id}): it is downloading from {obj.source}")

    return perform(request, _back(project), work)


@router.get("/data/{kind}/{ref}/remove", response_class=HTMLResponse)
def confirm_removal(request: Request, kind: str, ref: str, who: SignedIn) -> Response:
    with reading(request) as session:
        obj = data_objects.get(session, who.principal, kind, ref)
        name = data_objects.project_name(session, obj)
        return page(
            request,
            "confirm.html",
            who,
            title=f"Remove {obj.kind} {obj.name}",
            text=(
                f"Remove {obj.kind} '{obj.name}' of project '{name}'? Jobs can no longer mount it and its "
                "bytes are deleted; a job that mounts it now keeps it (the removal is refused)."
            ),
            action=f"/data/{obj.kind}/{obj.id}/remove",
            button=f"Remove {obj.kind}",
            force=False,
            back=_back(name),
        )


@router.post("/data/{kind}/{ref}/remove")
def remove(request: Request, kind: str, ref: str, posted: Posted) -> Response:
    who, _ = posted

    def work(session: Session) -> Done:
        obj = data_objects.remove(session, who.principal, kind, ref)
        return Done(f"{obj.kind} {obj.name} removed", _back(data_objects.project_name(session, obj)))

    return perform(request, "/data", work)
