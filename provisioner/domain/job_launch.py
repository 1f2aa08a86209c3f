"""ChainOpera (FedML) Launch job.yaml -> rigbase spec data (docs/job-spec.md "ChainOpera Launch").

workspace: hello_world             -> the job's name (the code itself is not uploaded: see notes)
bootstrap: |  …                    -> run before the job's commands, in the same worker
job: |  …                          -> the worker's command
computing:
  minimum_num_gpus: 1              -> resources.gpu_count
  maximum_cost_per_hour: $1.75     -> resources.max_price = cost / GPUs (Launch's figure is for all GPUs)
  resource_type: A100-80G          -> resources.gpu_types (catalogue name)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any, Final

from contracts.gpu_types import resolve_gpu_type
from contracts.jobspec import CPU_STEP, DEFAULT_IMAGE, FieldPath, JobType, RuleErrors, format_path
from provisioner.domain.job_source import Converted, dns_name

# Launch's job_type values; a spec without one is a training job.
JOB_TYPES: Final[dict[str, JobType]] = {
    "train": JobType.TRAINING,
    "training": JobType.TRAINING,
    "federate": JobType.TRAINING,
    "deploy": JobType.ENDPOINT,
    "serve": JobType.ENDPOINT,
    "inference": JobType.INFERENCE,
}
# Keys that mark a Launch job.yaml (with `job` given as text).
MARKERS: Final = frozenset({"workspace", "bootstrap", "computing", "fedml_env"})
KNOWN: Final = MARKERS | {"job", "job_type", "job_name"}
COMPUTING_KNOWN: Final = frozenset(
    {"minimum_num_gpus", "maximum_cost_per_hour", "resource_type", "device_type"}
)
_COST = re.compile(r"\$?\s*(\d+(?:\.\d+)?)\s*(?:/\s*h(?:ou)?r)?")


def is_launch(doc: Mapping[str, Any]) -> bool:
    return isinstance(doc.get("job"), str) or bool(MARKERS & set(doc))


def to_rigbase(doc: Mapping[str, Any], filename: str | None) -> Converted:
    errors: list[tuple[FieldPath, str]] = []
    notes: list[str] = []
    origin: dict[FieldPath, FieldPath] = {("workers",): ("job",)}

    job = doc.get("job")
    if not isinstance(job, str) or not job.strip():
        errors.append((("job",), "required: the entry commands, as a block of shell lines (job: |)"))
    bootstrap = doc.get("bootstrap")
    if bootstrap is not None and not isinstance(bootstrap, str):
        errors.append((("bootstrap",), "must be shell lines (bootstrap: |)"))

    computing = doc.get("computing", {})
    if not isinstance(computing, Mapping):
        errors.append(
            (("computing",), "must be a mapping (minimum_num_gpus, maximum_cost_per_hour, resource_type)")
        )
        computing = {}
    resources, resource_origin = _resources(computing, errors, notes)
    origin.update(resource_origin)

    job_type = doc.get("job_type", "train")
    if str(job_type).lower() not in JOB_TYPES:
        errors.append((("job_type",), f"must be one of {', '.join(JOB_TYPES)}"))
    name, name_from = _name(doc, filename)
    origin[("name",)] = name_from
    notes.append(f"name {name!r} from {format_path(name_from)} (a Launch job.yaml names no job)")
    workspace = doc.get("workspace")
    if workspace:
        notes.append(
            f"workspace {workspace!r} is not uploaded: put the code in environment.image or a dataset "
            "(rigbase runs the commands in the container image)"
        )
    notes.append(
        f"no image: a Launch file names none, so the workers run {DEFAULT_IMAGE}, which each node pulls "
        "when the job starts; to choose one, convert it (`provision job convert`) and set environment.image"
    )
    fedml_env = doc.get("fedml_env")
    if isinstance(fedml_env, Mapping) and fedml_env.get("project_name"):
        notes.append(
            f"fedml_env.project_name {fedml_env['project_name']!r}: use --project to choose the project"
        )
    notes += [f"{key}: not a rigbase setting, ignored" for key in doc if key not in KNOWN]
    if errors:
        raise RuleErrors(errors)

    assert isinstance(job, str)
    command = job.strip("\n")
    if isinstance(bootstrap, str) and bootstrap.strip():
        command = f"# bootstrap\n{bootstrap.strip(chr(10))}\n# job\n{command}"
    data: dict[str, Any] = {
        "name": name,
        "type": JOB_TYPES[str(job_type).lower()].value,
        "resources": resources,
        "workers": [command],
    }
    return Converted(data=data, origin=origin, notes=notes)


def _resources(
    computing: Mapping[str, Any], errors: list[tuple[FieldPath, str]], notes: list[str]
) -> tuple[dict[str, Any], dict[FieldPath, FieldPath]]:
    where: FieldPath = ("computing",)
    origin: dict[FieldPath, FieldPath] = {("resources",): where}
    cpu_only = str(computing.get("device_type", "GPU")).upper() == "CPU"
    gpus = computing.get("minimum_num_gpus", 0 if cpu_only else 1)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
        errors.append(((*where, "minimum_num_gpus"), "must be a whole number of GPUs, 0 or more"))
        gpus = 1
    origin[("resources", "gpu_count")] = (*where, "minimum_num_gpus")
    resources: dict[str, Any] = {"gpu_count": gpus}

    if gpus > 0:
        resource_type = computing.get("resource_type")
        origin[("resources", "gpu_types")] = (*where, "resource_type")
        if not isinstance(resource_type, str) or not resource_type.strip():
            errors.append(((*where, "resource_type"), "required for a GPU job: the GPU type, e.g. A100-80G"))
        else:
            try:
                resources["gpu_types"] = list(resolve_gpu_type(resource_type))
            except ValueError as exc:
                errors.append(((*where, "resource_type"), str(exc)))
    else:
        resources["cpu_count"] = CPU_STEP
        notes.append(f"a CPU-only job: resources.cpu_count set to {CPU_STEP} (Launch names no vCPU count)")

    cost = computing.get("maximum_cost_per_hour")
    if cost is not None:
        origin[("resources", "max_price")] = (*where, "maximum_cost_per_hour")
        match = _COST.fullmatch(str(cost).strip()) if not isinstance(cost, bool) else None
        if match is None:
            errors.append(((*where, "maximum_cost_per_hour"), "must be a price per hour, e.g. $1.75"))
        elif gpus > 0:
            total = float(match.group(1))
            resources["max_price"] = round(total / gpus, 6)
            if gpus > 1:
                notes.append(
                    f"maximum_cost_per_hour {cost} is for all {gpus} GPUs: "
                    f"resources.max_price = {resources['max_price']} per GPU-hour"
                )
        else:
            notes.append("maximum_cost_per_hour ignored: rigbase prices GPU-hours and this job has no GPU")
    notes += [
        f"computing.{key}: not a rigbase setting, ignored" for key in computing if key not in COMPUTING_KNOWN
    ]
    return resources, origin


def _name(doc: Mapping[str, Any], filename: str | None) -> tuple[str, FieldPath]:
    """Launch files name no job: job_name if present, else the workspace, the project, the file's name."""
    fedml_env = doc.get("fedml_env")
    project = fedml_env.get("project_name") if isinstance(fedml_env, Mapping) else None
    candidates: list[tuple[Any, FieldPath]] = [
        (doc.get("job_name"), ("job_name",)),
        (doc.get("workspace"), ("workspace",)),
        (project, ("fedml_env", "project_name")),
    ]
    for value, path in candidates:
        if isinstance(value, str) and value.strip(" ./"):
            return dns_name(PurePath(value).name or value), path
    stem = PurePath(filename).stem if filename else ""
    return dns_name(stem, fallback="launch-job"), ("job",)
