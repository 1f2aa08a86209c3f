"""ChainOpera (FedML) Launch job.yaml -> rigbase spec data (docs/job-spec.md "ChainOpera Launch").

Read as Launch reads it (github:FedML-AI/FedML, python/fedml/computing/scheduler/scheduler_entry/
launch_manager.py FedMLJobConfig, and comm_utils/job_utils.py parse_job_type):

workspace: hello_world             -> model.source: `provision job create` uploads the directory (next to
                                      the file) as the job's model, and the commands run in it
                                      (/opt/ml/models), as Launch runs them in the workspace; also the name
bootstrap: |  …                    -> run before the job's commands, in the same worker
job: |  …                          -> the worker's command; {run_on_posix, run_on_windows}: the posix one
server_job: |  …                   -> a second group, `server` (one worker), beside the `client` group
job_type, else task_type           -> type (Launch reads job_type first, then task_type; serve -> endpoint)
docker: {image, registry}          -> environment.image (registry prefixed when the image names none)
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
from contracts.jobs import MODELS_PATH
from contracts.jobspec import CPU_STEP, DEFAULT_IMAGE, FieldPath, JobKind, JobType, RuleErrors, format_path
from provisioner.domain.job_source import Converted, dns_name

# Launch's job_type values; a spec without one is a training job.
JOB_TYPES: Final[dict[str, JobType]] = {
    "train": JobType.TRAINING,
    "training": JobType.TRAINING,
    "federate": JobType.TRAINING,
    "deploy": JobType.ENDPOINT,
    "serve": JobType.ENDPOINT,
    "inference": JobType.INFERENCE,
    "dev-environment": JobType.NOTEBOOK,  # task_type's third option
}
# Keys that mark a Launch job.yaml (with `job` given as text, or as its OS blocks).
MARKERS: Final = frozenset({"workspace", "bootstrap", "computing", "fedml_env", "server_job", "task_type"})
KNOWN: Final = MARKERS | {"job", "job_type", "job_name", "docker", "job_subtype"}
POSIX, WINDOWS = "run_on_posix", "run_on_windows"  # Launch's OS blocks of job, bootstrap and server_job
SERVER_GROUP, CLIENT_GROUP = "server", "client"  # a federated job's two halves
COMPUTING_KNOWN: Final = frozenset(
    {"minimum_num_gpus", "maximum_cost_per_hour", "resource_type", "device_type"}
)
_COST = re.compile(r"\$?\s*(\d+(?:\.\d+)?)\s*(?:/\s*h(?:ou)?r)?")


def is_launch(doc: Mapping[str, Any]) -> bool:
    job = doc.get("job")
    return isinstance(job, str) or (isinstance(job, Mapping) and POSIX in job) or bool(MARKERS & set(doc))


def _shell(
    doc: Mapping[str, Any], key: str, errors: list[tuple[FieldPath, str]], notes: list[str]
) -> tuple[str | None, FieldPath]:
    """A block of shell lines as Launch reads it: text, or its run_on_posix block (rigbase's nodes are
    Linux; a run_on_windows block is not run). None when absent or empty."""
    value = doc.get(key)
    where: FieldPath = (key,)
    if isinstance(value, Mapping):
        if value.get(WINDOWS):
            notes.append(f"{key}.{WINDOWS}: not run (rigbase's nodes are Linux; {key}.{POSIX} is)")
        value, where = value.get(POSIX), (key, POSIX)
    if value is None:
        return None, where
    if not isinstance(value, str):
        errors.append((where, f"must be shell lines ({key}: |), or {{{POSIX}: |, {WINDOWS}: |}}"))
        return None, where
    return (value.strip("\n") or None), where


def to_rigbase(doc: Mapping[str, Any], filename: str | None) -> Converted:
    errors: list[tuple[FieldPath, str]] = []
    notes: list[str] = []
    origin: dict[FieldPath, FieldPath] = {}

    job, job_at = _shell(doc, "job", errors, notes)
    origin[("workers",)] = job_at
    if job is None:
        errors.append((job_at, "required: the entry commands, as a block of shell lines (job: |)"))
    bootstrap, _ = _shell(doc, "bootstrap", errors, notes)
    server, server_at = _shell(doc, "server_job", errors, notes)

    computing = doc.get("computing", {})
    if not isinstance(computing, Mapping):
        errors.append(
            (("computing",), "must be a mapping (minimum_num_gpus, maximum_cost_per_hour, resource_type)")
        )
        computing = {}
    resources, resource_origin = _resources(computing, errors, notes)
    origin.update(resource_origin)
    job_type = _job_type(doc, origin, errors)
    name, name_from = _name(doc, filename)
    origin[("name",)] = name_from
    notes.append(f"name {name!r} from {format_path(name_from)} (a Launch job.yaml names no job)")
    image = _image(doc.get("docker"), errors, notes)
    notes += _notes(doc, image)
    if errors:
        raise RuleErrors(errors)

    assert job is not None and job_type is not None
    data: dict[str, Any] = {"name": name, "type": job_type.value, "resources": resources}
    if image is not None:
        data["environment"] = {"image": image}
        origin[("environment", "image")] = ("docker", "image")
    workspace = doc.get("workspace")
    here = ""  # Launch runs the bootstrap and the job in the workspace: so do the workers, in its upload
    if isinstance(workspace, str) and workspace:
        data["model"] = {"source": workspace if "://" in workspace else f"./{workspace.removeprefix('./')}"}
        origin[("model",)] = ("workspace",)
        here = f"cd {MODELS_PATH}\n"
    if server is None:
        data["workers"] = [here + _with_bootstrap(bootstrap, "job", job)]
        return Converted(data=data, origin=origin, notes=notes)
    # a federated job: the server half and the clients, placed and failed together
    data["kind"] = JobKind.GANG.value
    data["groups"] = [
        {"name": SERVER_GROUP, "command": here + _with_bootstrap(bootstrap, "server_job", server)},
        {"name": CLIENT_GROUP, "command": here + _with_bootstrap(bootstrap, "job", job)},
    ]
    origin[("groups", 0)] = server_at
    origin[("groups", 1)] = job_at
    notes.append(
        f"server_job and job: two groups, {SERVER_GROUP} and {CLIENT_GROUP}, one worker each with the "
        "computing resources, started together (a gang); each finds the other in RIGBASE_PEERS"
    )
    return Converted(data=data, origin=origin, notes=notes)


def _with_bootstrap(bootstrap: str | None, key: str, command: str) -> str:
    """Launch runs the bootstrap lines first, in the same shell."""
    return f"# bootstrap\n{bootstrap}\n# {key}\n{command}" if bootstrap else command


def _job_type(
    doc: Mapping[str, Any], origin: dict[FieldPath, FieldPath], errors: list[tuple[FieldPath, str]]
) -> JobType | None:
    """Launch reads job_type, and task_type only when there is no job_type (job_utils.parse_job_type)."""
    key = "job_type" if doc.get("job_type") is not None else "task_type"
    value = str(doc.get(key) or "train").lower()
    origin[("type",)] = (key,)
    if value not in JOB_TYPES:
        errors.append(((key,), f"must be one of {', '.join(JOB_TYPES)}"))
        return None
    return JOB_TYPES[value]


def _notes(doc: Mapping[str, Any], image: str | None) -> list[str]:
    """What the conversion leaves out: the workspace, the image when none is named, the project, the rest."""
    notes: list[str] = []
    workspace = doc.get("workspace")
    if workspace:
        notes.append(
            f"workspace {workspace!r}: uploaded by `provision job create` as the job's model (its .gitignore "
            "honoured); the commands run in it, at /opt/ml/models"
        )
    if image is None:
        notes.append(
            f"no image: the file names none (docker.image), so the workers run {DEFAULT_IMAGE}, which each "
            "node pulls when the job starts; to choose one, set docker.image"
        )
    fedml_env = doc.get("fedml_env")
    if isinstance(fedml_env, Mapping) and fedml_env.get("project_name"):
        notes.append(
            f"fedml_env.project_name {fedml_env['project_name']!r}: use --project to choose the project"
        )
    return notes + [f"{key}: not a rigbase setting, ignored" for key in doc if key not in KNOWN]


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


def _image(docker: Any, errors: list[tuple[FieldPath, str]], notes: list[str]) -> str | None:
    """Launch's docker block (job_utils.DockerArgs: image, registry, username, password, ports)."""
    if docker is None:
        return None
    if not isinstance(docker, Mapping):
        errors.append((("docker",), "must be a mapping (image, registry, username, password)"))
        return None
    image = docker.get("image")
    if not isinstance(image, str) or not image.strip():
        return None
    registry = docker.get("registry")
    first = image.split("/", 1)[0]
    names_registry = "/" in image and ("." in first or ":" in first or first == "localhost")
    if isinstance(registry, str) and registry.strip() and not names_registry:
        image = f"{registry.strip().rstrip('/')}/{image}"
    if docker.get("username") or docker.get("password"):
        notes.append(
            "docker.username and docker.password are not kept in a job: store them as the project's registry "
            "key (`provision project key set`), which every pull of the image uses"
        )
    if docker.get("ports"):
        notes.append("docker.ports: not published (a worker's peers reach it on RIGBASE_PORT)")
    return image


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
