"""What a notebook or endpoint job's worker serves, as data (docs/job-urls.md): JupyterLab's command line
for a notebook, and the server binding (port, health path) the minion checks before it calls the worker
running and that the job's URL reaches through the node's tunnel."""

from __future__ import annotations

import hashlib
import hmac
import shlex
from typing import Final

from contracts.jobs import ServeBinding
from contracts.jobspec import NOTEBOOK_PORT, JobSpec, JobType
from contracts.tunnel import JOB_URL_PATH

SERVED: Final = frozenset({JobType.NOTEBOOK, JobType.ENDPOINT})
NOTEBOOK_TOKEN_VARIABLE: Final = "JUPYTER_TOKEN"  # read by Jupyter itself: the token stays off argv
NOTEBOOK_ROOT: Final = "/opt/ml"  # where the data layer mounts datasets, models, checkpoints and output
NO_JUPYTER: Final = (
    "rigbase: this image has no `jupyter` command: leave environment.image out for the default "
    "notebook image, or install jupyterlab in yours"
)
_TOKEN_LABEL: Final = b"rigbase notebook token v1"


def job_path(job_id: str) -> str:
    return JOB_URL_PATH.format(job_id=job_id)


def notebook_command(job_id: str, setup: str) -> str:
    """`setup` (the spec's packages and command, often empty), then JupyterLab in the foreground on
    NOTEBOOK_PORT under the job's path, its token from JUPYTER_TOKEN, rooted where the job's data is."""
    jupyter = [
        "jupyter",
        "lab",
        "--ip=0.0.0.0",
        f"--port={NOTEBOOK_PORT}",
        "--no-browser",
        "--allow-root",
        "--ServerApp.port_retries=0",
        f"--ServerApp.base_url={job_path(job_id)}",
        f"--ServerApp.root_dir={NOTEBOOK_ROOT}",
    ]
    lines = [
        setup,
        f"mkdir -p {NOTEBOOK_ROOT}/output",
        f"command -v jupyter >/dev/null 2>&1 || {{ echo {shlex.quote(NO_JUPYTER)} >&2; exit 127; }}",
        "exec " + shlex.join(jupyter),
    ]
    return "\n".join(line for line in lines if line.strip())


def serve_binding(spec: JobSpec, job_id: str) -> ServeBinding | None:
    """The server worker 0 of a notebook or endpoint job runs; None for other jobs, or an endpoint that
    names no port."""
    port = spec.serve_port if spec.type in SERVED else None
    if port is None:
        return None
    if spec.type is JobType.NOTEBOOK:  # Jupyter's GET /api answers its version without a token
        return ServeBinding(
            port=port, health_path=job_path(job_id) + "api", status_path=job_path(job_id) + "api/status"
        )
    assert spec.endpoint is not None
    return ServeBinding(port=port, health_path=spec.endpoint.health_path)


def notebook_token(key: bytes, job_id: str) -> str:
    """The notebook's Jupyter token: derived from the control plane's key, so it is never stored and the
    control plane can give it to the job's owner again."""
    return hmac.new(key, _TOKEN_LABEL + job_id.encode(), hashlib.sha256).hexdigest()[:48]
