"""A job's secret environment values (`NAME: {value, secret: true}` in its spec, contracts.jobspec.
SecretValue): sealed at rest in `jobs.sealed_env` (the store's sealer, provisioner/adapters/secrets.py),
never in the stored spec, so no answer (`job show`, the console, the audit trail) carries them. They go
into a worker's environment only with an assignment that needs its secrets
(job_assignments.needs_secrets: starting or running, on a node in good standing)."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

from sqlalchemy.orm import Session

from contracts.errors import InvalidInput
from provisioner.services.accounts import project_keys
from provisioner.services.common.runtime import runtime_of
from provisioner.store.job_models import Job

REDACTED = {"secret": True}  # what the stored spec keeps of a secret value: its name and that it is one


def _env(spec: Mapping[str, Any]) -> dict[str, Any]:
    return dict((spec.get("environment") or {}).get("env") or {})


def seal(session: Session, spec: Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The spec to store (each secret value redacted) and its secret values sealed (None: it has none).
    A secret without its value is refused: there is nothing to seal."""
    stored = copy.deepcopy(dict(spec))
    env = _env(stored)
    secrets = {name: item for name, item in env.items() if isinstance(item, Mapping) and item.get("secret")}
    if not secrets:
        return stored, None
    missing = sorted(name for name, item in secrets.items() if item.get("value") is None)
    if missing:
        raise InvalidInput(
            f"environment.env.{missing[0]}: a secret needs its value ({{value: ..., secret: true}})",
            code="invalid_job_spec",
        )
    for name in secrets:
        env[name] = dict(REDACTED)
    stored["environment"]["env"] = env
    values = {name: str(item["value"]) for name, item in secrets.items()}
    return stored, runtime_of(session).sealer.seal(json.dumps(values).encode())


def environment(session: Session, job: Job, *, with_secrets: bool) -> dict[str, str]:
    """The job's variables as a worker gets them: plain ones always; secret ones and the project keys the
    spec names (environment.keys, as AWS_ACCESS_KEY_ID, HF_TOKEN, …) only `with_secrets`."""
    plain = {str(k): str(v) for k, v in _env(job.spec).items() if not isinstance(v, Mapping)}
    if not with_secrets:
        return plain
    refs = list((job.spec.get("environment") or {}).get("keys") or [])
    keys = project_keys.job_variables(session, job, refs) if refs else {}
    if job.sealed_env is None:
        return {**plain, **keys}
    sealed: dict[str, str] = json.loads(runtime_of(session).sealer.unseal(job.sealed_env))
    return {**plain, **sealed, **keys}
