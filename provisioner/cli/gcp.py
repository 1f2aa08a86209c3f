"""The Google Cloud parts of `provision`: `provider enable gcp`, `region quota`,
`region create --provider gcp`.

`provider enable` and `region create` in providers.py / regions.py hand over here when the kind is gcp.
Human output: facts and progress on stderr, the new id alone on stdout (`ID=$(provision …)`)."""

from __future__ import annotations

import sys
from collections.abc import Collection
from pathlib import Path
from typing import Annotated, Any

import typer

from contracts.errors import RigbaseError
from provisioner.cli import render
from provisioner.cli.common import EXIT_USAGE, CliError, Json, fail, from_refusal
from provisioner.cli.settings import connect
from provisioner.cli.wait import poll
from provisioner.client import Client
from provisioner.domain.states import (
    PROVIDER_FAILED_OR_GONE,
    ProviderState,
)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def read_credentials(source: str) -> str:
    """The key file's text; `-` reads stdin. An unreadable file is a usage error (exit 2)."""
    if source == "-":
        return sys.stdin.read()
    try:
        return Path(source).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(
            f"cannot read credentials file {source} ({exc.__class__.__name__}): "
            "pass the service-account JSON key file, or - to read it from stdin",
            exit_code=EXIT_USAGE,
        ) from None


def _plan_table(plan: list[dict[str, Any]], as_json: bool) -> None:
    render.table(
        plan, [("verb", "ACTION"), ("kind", "KIND"), ("name", "NAME"), ("detail", "DETAIL")], as_json=as_json
    )


def enable(
    credentials: str | None,
    prefix: str | None,
    payment_mode: str | None,
    dry_run: bool,
    json_out: bool,
    wait: bool = False,
    timeout: float = 600,
) -> None:
    if not credentials:
        fail(
            "gcp needs --credentials FILE (a service-account JSON key) or --credentials - to read it "
            "from stdin",
            exit_code=EXIT_USAGE,
        )
    body = {
        "credentials": read_credentials(credentials),
        "prefix": prefix,
        "payment_mode": payment_mode,
        "dry_run": dry_run,
    }
    client = connect()
    result = client.post("/v1/gcp/enable", body)
    if json_out:
        render.print_json(result)
        return
    _say(f"project: {result['project_id']}")
    _say(f"service account: {result['client_email']}")
    _say(f"permissions: {result['permissions']['message']}")
    if dry_run:
        _say("dry run: nothing created; enabling would create:")
        _plan_table(result["plan"], as_json=False)
        return
    _say(f"bootstrapping the project ({len(result['plan'])} resources)")
    if wait:
        _poll(
            client,
            "/v1/gcp/provider",
            lambda st: (st["provider"]["state"], st["progress"]),
            done={ProviderState.ENABLED},
            failed=PROVIDER_FAILED_OR_GONE,
            timeout=timeout,
        )
    print(result["provider"]["id"])


def _poll(
    client: Client, path: str, read: Any, *, done: Collection[str], failed: Collection[str], timeout: float
) -> dict[str, Any]:
    """Poll `path` until read(answer)'s state is in done (or failed), printing each new progress line
    (one line per change rather than a status spinner: `--wait` on a VM takes minutes and ends up in logs)."""
    last: list[tuple[str, str | None]] = []

    def say_changes(_name: str, state: str, progress: str | None, elapsed: float) -> None:
        if not last or last[-1] != (state, progress):
            _say(f"[{elapsed:4.0f} s] {state}: {progress}")
            last.append((state, progress))

    return poll(
        client,
        path,
        lambda answer: (path.rsplit("/", 1)[-1], *read(answer)),
        done=done,
        failed=failed,
        timeout=timeout,
        show=say_changes,
    )


def quota(
    region: Annotated[
        str, typer.Argument(help="GCP region, e.g. us-central1 (one of the ten in the catalogue).")
    ],
    from_json: Annotated[
        Path | None,
        typer.Option(
            "--from-json",
            help="A saved Region resource (`gcloud compute regions describe REGION "
            "--format=json`): works offline, without any provider.",
        ),
    ] = None,
    json_out: Json = False,
) -> None:
    """GPU capacity of a GCP region from its quotas: runnable 1-GPU jobs per GPU type and what limits them."""
    if from_json is not None:
        from provisioner.providers.gcp import quota as gcp_quota

        try:
            rq = gcp_quota.from_json_file(from_json, region)
        except RigbaseError as exc:
            raise from_refusal(exc) from None
        result: dict[str, Any] = rq.to_json()
    else:
        result = connect().get(f"/v1/gcp/quota/{region}")
    if json_out:
        render.print_json(
            {"region": result["region"], "gpus": result["gpus"], "spot": result.get("spot", [])}
        )
        return
    quota_table(result["gpus"])
    if result.get("spot"):
        print("\nSpot VMs (the preemptible quotas where the project has them, else the standard ones):")
        quota_table(result["spot"])


def _n(x: float) -> str:
    return f"{x:g}"


QUOTA_COLUMNS = [
    ("gpu", "GPU"),
    ("gpus", "GPUS LIMIT/USED/FREE (METRIC)"),
    ("cpus", "FREE CPUS (METRIC) ÷ PER GPU"),
    ("ssd", "FREE LOCAL SSD GB ÷ PER JOB"),
    ("runnable_jobs", "RUNNABLE JOBS"),
    ("limited_by", "LIMITED BY"),
]


def quota_table(gpus: list[dict[str, Any]], err: bool = False) -> None:
    """CloudBender's rule, one row per GPU type: each factor with the jobs it allows."""
    rows = [
        {
            "gpu": g["gpu"],
            "gpus": f"{_n(g['gpu_limit'])}/{_n(g['gpu_usage'])}/{_n(g['gpu_free'])} ({g['metric']})",
            "cpus": (
                f"{_n(g['cpus_free'])} ({g['cpu_metric']}) ÷ {g['cpus_per_gpu']} = {g['jobs_by_cpus']:.4g}"
            ),
            "ssd": (
                f"{_n(g['local_ssd_free_gb'])} ÷ {g['local_ssd_gb_per_job']} = {g['jobs_by_local_ssd']:.4g}"
            ),
            "runnable_jobs": g["runnable_jobs"],
            "limited_by": g["limited_by"],
        }
        for g in gpus
    ]
    columns = QUOTA_COLUMNS
    if not rows:
        print(
            "(no GPU type of the catalogue is offered in this region)", file=sys.stderr if err else sys.stdout
        )
        return
    if err:
        from contextlib import redirect_stdout

        with redirect_stdout(sys.stderr):
            render.table(rows, columns, as_json=False)
    else:
        render.table(rows, columns, as_json=False)


def create_region(
    name: str,
    gcp_region: str | None,
    storage_class: str | None,
    public_jobs: bool,
    dry_run: bool,
    json_out: bool,
) -> None:
    if not storage_class:
        fail(
            "a GCP region needs --storage-class: small, medium, large or xlarge (see docs/gcp.md)",
            exit_code=EXIT_USAGE,
        )
    client = connect()
    body = {
        "name": name,
        "gcp_region": gcp_region,
        "storage_class": storage_class,
        "public_jobs": public_jobs,
        "dry_run": dry_run,
    }
    result = client.post("/v1/gcp/regions", body)
    if dry_run:
        if json_out:
            render.print_json(result)
            return
        quota_table(result["quota"]["gpus"])
        print()
        _say("dry run: nothing created; creating the region would make:")
        _plan_table(result["plan"], as_json=False)
        return
    if not json_out:
        # nothing to wait for at creation: the region's image is built from its bundle and published
        # first (the storage node's progress says so); its VM is created once the image is published
        quota_table(result["quota"]["gpus"], err=True)
        progress = (result.get("vm") or {}).get("progress") or ""
        _say(f"storage node {result['node']['name']}: {progress}")
    render.created(result["region"], as_json=json_out)
