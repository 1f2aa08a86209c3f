"""The console's jobs: the account's list, the submit form (the spec text `provision job create` reads: a
rigbase YAML/JSON spec, a ChainOpera Launch job.yaml, an OpenPAI job JSON or a trainML job form), a job's
page with its live log, and the Stop button. Every call is the one the API route makes (services/jobs/jobs.py,
services/jobs/job_logs.py) with the signed-in token's principal, so another account's job answers the same
404 as a missing one (services/jobs.get is account-scoped).

Live logs: the job page shows the log as stored when it was rendered (and works so without JavaScript:
Refresh reloads it); static/console.js then asks GET /jobs/{id}/log?worker=N&offset=M for what came
after, as `provision job logs --follow` does, until the answer says the log is complete."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Final

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from sqlalchemy.orm import Session

from contracts.errors import InvalidInput, RigbaseError
from contracts.jobspec import SpecError
from provisioner.api.console import charts
from provisioner.api.console.forms import Form, Posted, SignedIn, Who, whole_number
from provisioner.api.console.render import (
    SECURITY_HEADERS,
    ConsoleRoute,
    Done,
    page,
    perform,
    reading,
    redirect,
)
from provisioner.api.errors import http_status
from provisioner.domain import job_formats
from provisioner.domain.placement_rows import MATCH_HEADERS, match_rows
from provisioner.domain.states import JOB_DONE, JobState
from provisioner.domain.text import printable
from provisioner.services.accounts import projects
from provisioner.services.billing import job_cost
from provisioner.services.jobs import job_autostop, job_logs, job_metrics, job_usage, jobs
from provisioner.store.job_models import Job

router = APIRouter(include_in_schema=False, route_class=ConsoleRoute)

SPEC_FIELD: Final = "spec"
# What the submit form shows as a starting point (docs/job-spec.md has every field).
SPEC_EXAMPLE: Final = """name: hello
type: training
resources:
  gpu_count: 0
  cpu_count: 2
workers:
  - echo hello from rigbase
environment:
  image: docker.io/library/python:3.12-slim
"""


def _stoppable(job: Job) -> bool:
    return JobState(job.state) not in JOB_DONE


@router.get("/jobs", response_class=HTMLResponse)
def job_list(request: Request, who: SignedIn) -> Response:
    """The account's jobs, newest first (services/jobs.list_all is account-scoped for every role)."""
    q, state = request.query_params.get("q", "").strip()[:63], request.query_params.get("state", "")
    with reading(request) as session:
        found = [
            j
            for j in jobs.list_all(session, who.principal)
            if q.lower() in j.name.lower() and state in ("", j.state)
        ]
        return page(
            request,
            "jobs.html",
            who,
            jobs=found,
            costs=job_cost.costs(session, found, datetime.now(UTC)),
            q=q,
            state=state,
            job_state_names=[s.value for s in JobState],
        )


def _submit_form(
    request: Request,
    session: Session,
    who: Who,
    *,
    text: str = "",
    project: str = "",
    errors: list[str] | None = None,
    placement: dict[str, Any] | None = None,
    status: int = 200,
) -> Response:
    return page(
        request,
        "job_new.html",
        who,
        status=status,
        text=text,
        example=SPEC_EXAMPLE,
        project=project,
        projects=projects.list_all(session, who.principal.account_id),
        errors=errors or [],
        placement=placement,
        match_headers=MATCH_HEADERS,
    )


@router.get("/jobs/new", response_class=HTMLResponse)
def submit_form(request: Request, who: SignedIn) -> Response:
    with reading(request) as session:
        return _submit_form(request, session, who)


def _parsed(form: Form) -> job_formats.ParsedSpec:
    text = form.fields.get(SPEC_FIELD, [""])[0]  # as typed: YAML's indentation matters
    if not text.strip():
        raise InvalidInput("the job spec is empty: paste a job spec (YAML or JSON) into the form")
    return job_formats.read(text)


@router.post("/jobs")
def submit(request: Request, posted: Posted) -> Response:
    """Create the job (button `submit`), or show where it would run and store nothing (`dry-run`), as
    `provision job create [--dry-run]` does. A refusal shows the form again with the text as typed and
    the API's lines (one per spec error), so nothing typed is lost."""
    who, form = posted
    text = form.fields.get(SPEC_FIELD, [""])[0]
    project = form.get("project")
    dry_run = form.get("do") == "dry-run"
    session: Session = request.app.state.sessions()
    try:
        parsed = _parsed(form)
        sub = jobs.create(session, who.principal, parsed.spec, project=project or None, dry_run=dry_run)
        if dry_run:
            first = sub.decision.first
            placement = {
                "fits": sub.decision.packing.complete,
                "unplaceable": sub.decision.unplaceable,
                "reason": sub.decision.reason,
                "workers": [
                    (w, sub.plan[w].group, f"{c.name} ({c.region})" if c is not None else "waits")
                    for w, c in zip(sub.decision.packing.workers, sub.decision.packing.chosen, strict=True)
                ],
                "rows": [row.cells() for row in match_rows(first)],
                "rejected": [(c.name, c.region, m) for c, _, m in first.rejected[:20]],
                "rejected_total": len(first.rejected),
                "notes": parsed.notes,
                "warnings": sub.warnings,  # what would stop or hold it at start (data, image)
            }
            session.rollback()
            return _submit_form(request, session, who, text=text, project=project, placement=placement)
        job = sub.job
        assert job is not None
        session.flush()
        where = f"starting on node {job.node.name}" if job.node is not None else f"waiting: {job.reason}"
        done = Done(f"job {job.name} created: {where}", f"/jobs/{job.id}")
        session.commit()
    except RigbaseError as exc:
        session.rollback()
        lines = exc.errors if isinstance(exc, SpecError) else [exc.message]
        return _submit_form(
            request, session, who, text=text, project=project, errors=lines, status=http_status(exc)
        )
    finally:
        session.close()
    return redirect(request, done.to or "/jobs", "ok", done.message)


def _worker_index(request: Request, job: Job) -> int:
    raw = request.query_params.get("worker", "0")
    workers = max(len(job.workers), 1)
    try:
        return whole_number(raw, "worker", end=workers)
    except InvalidInput:
        raise InvalidInput(
            f"worker '{printable(raw, 40)}' is not a worker of job '{job.name}': use 0-{workers - 1}",
            code="no_such_worker",
        ) from None


@router.get("/jobs/{ref}", response_class=HTMLResponse)
def job_page(request: Request, ref: str, who: SignedIn) -> Response:
    with reading(request) as session:
        job = jobs.get(session, who.principal, ref)
        worker = _worker_index(request, job)
        log = job_logs.read(session, who.principal, job.id, worker, 0) if job.workers else None
        metrics = job_metrics.read(session, who.principal, job.id)
        first = job.workers[0] if job.workers else None
        now = datetime.now(UTC)
        return page(
            request,
            "job.html",
            who,
            job=job,
            worker=worker,
            log=log,
            cost=job_cost.costs(session, [job], now)[job.id],
            autostop_left=job_autostop.left_s(job, first, now) if first is not None else None,
            latest=charts.latest_points(metrics.points),
            stoppable=_stoppable(job),
            history=jobs.history(session, who.principal, job.id),
        )


@router.get("/jobs/{ref}/charts")
def job_charts(request: Request, ref: str, who: SignedIn) -> Response:
    """The job page's chart data as uPlot reads it: the metrics by step, each worker's usage by time."""
    with reading(request) as session:
        job = jobs.get(session, who.principal, ref)
        metrics = job_metrics.read(session, who.principal, job.id)
        usage = job_usage.read(session, who.principal, job.id)
        return JSONResponse(
            {"metrics": charts.metric_series(metrics.points), "usage": charts.usage_series(usage.samples)},
            headers=SECURITY_HEADERS,
        )


@router.get("/jobs/{ref}/log")
def job_log(request: Request, ref: str, who: SignedIn) -> Response:
    """One worker's log from `offset` as JSON, for the job page's script: the fields of GET
    /v1/jobs/{ref}/logs (services/job_logs.read), with the session cookie instead of a bearer token."""
    offset = whole_number(request.query_params.get("offset", "0"), "offset")
    with reading(request) as session:
        job = jobs.get(session, who.principal, ref)
        got = job_logs.read(session, who.principal, job.id, _worker_index(request, job), offset)
        return JSONResponse(got.__dict__, headers=SECURITY_HEADERS)


@router.post("/jobs/{ref}/stop")
def stop_job(request: Request, ref: str, posted: Posted) -> Response:
    """Stop (cancel) the job, as `provision job stop`: its nodes send SIGTERM, then kill after the grace."""
    who, _ = posted

    def work(session: Session) -> Done:
        job = jobs.stop(session, who.principal, ref)
        return Done(f"job {job.name} is {job.state}: its workers get SIGTERM, then SIGKILL after the grace")

    return perform(request, f"/jobs/{ref}", work)
