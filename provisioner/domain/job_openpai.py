"""OpenPAI job JSON (protocol v1) -> rigbase spec data (docs/job-spec.md "OpenPAI").

jobName                  -> name (as a DNS label)
image                    -> environment.image
jobEnvs                  -> environment.env
gpuType                  -> resources.gpu_types (absent: every NVIDIA type, as OpenPAI takes any GPU)
taskRoles[i]             -> groups[i], role by role (a gang: OpenPAI places a job's tasks together)
taskRoles[i].name        -> groups[i].name (OpenPAI's PAI_* variables name it)
taskRoles[i].taskNumber  -> groups[i].count
taskRoles[i].command     -> groups[i].command
taskRoles[i].gpuNumber   -> groups[i].resources.gpu_count (a parameter server of 0 GPUs beside GPU workers)
taskRoles[i].cpuNumber   -> groups[i].resources.cpu_count (rounded up to a multiple of 4)
taskRoles[i].memoryMB    -> not kept: rigbase sizes a worker's memory from its share of the node
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from contracts.gpu_types import NVIDIA_GPU_TYPES, resolve_gpu_type
from contracts.jobspec import CPU_STEP, FieldPath, JobKind, JobType, RuleErrors
from provisioner.domain.job_source import Converted, dns_name

KNOWN: Final = frozenset({"jobName", "image", "taskRoles", "jobEnvs", "gpuType"})
ROLE_KNOWN: Final = frozenset({"name", "taskNumber", "cpuNumber", "memoryMB", "gpuNumber", "command"})
# (field, smallest value); all are required by OpenPAI's v1 protocol
ROLE_NUMBERS: Final[tuple[tuple[str, int], ...]] = (
    ("taskNumber", 1),
    ("cpuNumber", 1),
    ("memoryMB", 1),
    ("gpuNumber", 0),
)


def is_openpai(doc: Mapping[str, Any]) -> bool:
    return "taskRoles" in doc or "jobName" in doc


def to_rigbase(doc: Mapping[str, Any]) -> Converted:
    errors: list[tuple[FieldPath, str]] = []
    notes: list[str] = []
    checked, env = _read_top_level(doc, errors, notes)
    if errors:
        raise RuleErrors(errors)
    origin: dict[FieldPath, FieldPath] = {
        ("name",): ("jobName",),
        ("environment", "image"): ("image",),
        ("environment", "env"): ("jobEnvs",),
        ("groups",): ("taskRoles",),
    }
    groups = _groups(doc, checked, origin, errors, notes)
    if errors:
        raise RuleErrors(errors)
    name = dns_name(str(doc["jobName"]))
    if name != doc["jobName"]:
        notes.append(f"name {name!r} from jobName {doc['jobName']!r} (a rigbase name is a DNS label)")
    data: dict[str, Any] = {
        "name": name,
        "type": JobType.TRAINING.value,
        "kind": JobKind.GANG.value,
        "groups": groups,
        "environment": {"image": doc["image"], "env": dict(env)},
    }
    return Converted(data=data, origin=origin, notes=notes)


def _read_top_level(
    doc: Mapping[str, Any], errors: list[tuple[FieldPath, str]], notes: list[str]
) -> tuple[list[dict[str, Any]], Any]:
    """The checked task roles and the job's environment; what is missing or wrong goes to `errors`."""
    for key, what in (("jobName", "the job's name"), ("image", "the Docker image, e.g. ubuntu:22.04")):
        if not isinstance(doc.get(key), str) or not str(doc.get(key)).strip():
            errors.append(((key,), f"required: {what}"))
    roles = doc.get("taskRoles")
    if not isinstance(roles, list) or not roles:
        errors.append((("taskRoles",), "required: a list of task roles (name, taskNumber, … command)"))
        roles = []
    checked = [_role(index, role, errors, notes) for index, role in enumerate(roles)]
    env = doc.get("jobEnvs", {})
    if not isinstance(env, Mapping):
        errors.append((("jobEnvs",), "must be a mapping of variable names to values"))
    notes += [f"{key}: not a rigbase setting, ignored" for key in doc if key not in KNOWN]
    return checked, env


def _groups(
    doc: Mapping[str, Any],
    checked: list[dict[str, Any]],
    origin: dict[FieldPath, FieldPath],
    errors: list[tuple[FieldPath, str]],
    notes: list[str],
) -> list[dict[str, Any]]:
    """One group per task role, in order, each with the role's own GPUs and CPUs."""
    groups: list[dict[str, Any]] = []
    types: list[str] | None = None
    for index, role in enumerate(checked):
        at: FieldPath = ("groups", index)
        resources: dict[str, Any] = {"gpu_count": role["gpuNumber"]}
        origin[(*at, "resources", "gpu_count")] = ("taskRoles", index, "gpuNumber")
        if role["gpuNumber"]:
            types = _gpu_types(doc, errors, notes) if types is None else types
            resources["gpu_types"] = types
            origin[(*at, "resources", "gpu_types")] = ("gpuType",)
        cpus = role["cpuNumber"]
        resources["cpu_count"] = -(-cpus // CPU_STEP) * CPU_STEP
        origin[(*at, "resources", "cpu_count")] = ("taskRoles", index, "cpuNumber")
        if resources["cpu_count"] != cpus:
            notes.append(
                f"groups[{index}].resources.cpu_count = {resources['cpu_count']}: cpuNumber {cpus} "
                "rounded up to a multiple of 4"
            )
        for key, source in (("name", "name"), ("count", "taskNumber"), ("command", "command")):
            origin[(*at, key)] = ("taskRoles", index, source)
        groups.append(
            {
                "name": role["name"],
                "count": role["taskNumber"],
                "command": role["command"],
                "resources": resources,
            }
        )
    notes.append("memoryMB not kept: rigbase sizes each worker's memory from its share of the node")
    if len(checked) > 1 or checked[0]["taskNumber"] > 1:
        notes.append(
            "a gang job: every task is placed and started together, and fails whole, as OpenPAI runs it"
        )
    return groups


def _role(index: int, role: Any, errors: list[tuple[FieldPath, str]], notes: list[str]) -> dict[str, Any]:
    where: FieldPath = ("taskRoles", index)
    if not isinstance(role, Mapping):
        errors.append(
            (where, "must be a mapping (name, taskNumber, cpuNumber, memoryMB, gpuNumber, command)")
        )
        return {"name": "default", "taskNumber": 1, "cpuNumber": 1, "gpuNumber": 0, "command": ""}
    out: dict[str, Any] = {}
    for key, least in ROLE_NUMBERS:
        value = role.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            errors.append(
                ((*where, key), "required" if value is None else f"must be a whole number, {least} or more")
            )
            value = least
        out[key] = value
    command = role.get("command")
    if not isinstance(command, str) or not command.strip():
        errors.append(((*where, "command"), "required: the shell command of this task role"))
    out["command"] = command if isinstance(command, str) else ""
    if not isinstance(role.get("name"), str) or not role["name"]:
        errors.append(((*where, "name"), "required: the task role's name, e.g. default"))
    out["name"] = role.get("name") if isinstance(role.get("name"), str) else "default"
    notes += [
        f"taskRoles[{index}].{key}: not a rigbase setting, ignored" for key in role if key not in ROLE_KNOWN
    ]
    return out


def _gpu_types(doc: Mapping[str, Any], errors: list[tuple[FieldPath, str]], notes: list[str]) -> list[str]:
    gpu_type = doc.get("gpuType")
    if gpu_type is None:
        notes.append(
            "no gpuType: resources.gpu_types lists every NVIDIA type of the catalogue (OpenPAI takes any)"
        )
        return list(NVIDIA_GPU_TYPES)
    try:
        return list(resolve_gpu_type(str(gpu_type)))
    except ValueError as exc:
        errors.append((("gpuType",), str(exc)))
        return []
