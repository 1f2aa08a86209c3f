"""trainML's job form -> rigbase spec data (docs/job-spec.md "trainML job form").

The dictionary the trainML SDK's `jobs.create(...)` takes and its CLI sends (github:trainML/trainml-cli,
trainml/jobs.py): `type`, and the resources either at the top level (`gpu_types`, `gpu_count`,
`cpu_count`, `disk_size`, `max_price`) or in `resources` (with `gpu_type_id`), `workers` (commands, or
`{command}` each) or `worker_commands`, `environment`, `data`, `model`, `endpoint`.

name                     -> name (as a DNS label)
type                     -> type
gpu_types / gpu_type_id  -> resources.gpu_types, by trainML's ids (`rtx3090`, `a100xl`: TRAINML_GPU_IDS);
                            `cpu` alone is a CPU-only job
gpu_count, cpu_count, disk_size, max_price -> resources.*
workers, worker_commands -> workers; several run as independent runs, as trainML runs them (kind: independent)
environment.custom_image -> environment.image
environment.env          -> environment.env ([{key, value}] or a mapping)
environment.packages     -> environment.packages (apt, conda, pip)
data.datasets            -> data.datasets (names, or {id | name} each)
data.output_type/_uri    -> data.output: aws and wasabi -> {uri: s3://…}, gcp -> {uri: gs://…}, azure
                            (https://ACCOUNT.blob.core.windows.net/CONTAINER/…) -> {uri: azure://…}, trainml
                            -> a new {kind: output_uri (model, checkpoint, dataset), name: the job's name};
                            local and regional datastores are refused with what to write instead
model                    -> model.name for a trainml source (the model's name or id); model.source for a
                            git, aws, gcp, azure, web or local one, which `provision job create` makes
                            into a model
data.input_type/_uri     -> data.input.uri: the one-time download an inference job waits for (aws, wasabi,
                            gcp, azure, web); local and regional datastores are refused
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final
from urllib.parse import urlsplit

from contracts.gpu_types import TRAINML_CPU, TRAINML_GPU_IDS, resolve_gpu_type
from contracts.jobspec import FieldPath, JobKind, RuleErrors
from provisioner.domain.job_source import Converted, dns_name

RESOURCE_KEYS: Final = ("gpu_types", "gpu_type", "gpu_count", "cpu_count", "disk_size", "max_price")
# keys only trainML's form has at the top level (a rigbase spec keeps these under `resources`)
MARKERS: Final = frozenset({*RESOURCE_KEYS, "worker_commands", "project_uuid", "source_job_uuid"})
KNOWN: Final = frozenset(
    {"name", "type", "resources", "workers", "environment", "data", "model", "endpoint", *MARKERS}
)
# trainML's inference input types → the URI prefixes rigbase reads for them (data.input.uri)
INPUT_SCHEMES_OF: Final = {
    "aws": ("s3://",),
    "wasabi": ("s3://",),
    "gcp": ("gs://",),
    "web": ("https://", "http://"),
}
# trainML's key types → the project key kinds rigbase gives workers (environment.keys)
TRAINML_KEY_TYPES: Final = {
    "aws": "aws",
    "azure": "azure",
    "hf": "huggingface",
    "kaggle": "kaggle",
    "wandb": "wandb",
}
AZURE_HOST: Final = ".blob.core.windows.net"


def azure_uri(uri: str) -> str | None:
    """trainML's Azure path (https://ACCOUNT.blob.core.windows.net/CONTAINER/PATH) as rigbase's
    azure://ACCOUNT/CONTAINER/PATH; None when it is not one."""
    parts = urlsplit(uri)
    container = parts.path.strip("/")
    if parts.scheme != "https" or not (parts.hostname or "").endswith(AZURE_HOST) or not container:
        return None
    return f"azure://{(parts.hostname or '').removesuffix(AZURE_HOST)}/{container}"


# trainML's model source types → the source rigbase reads (None: this URI is not one of that type)
MODEL_SOURCES: Final[dict[str, Callable[[str], str | None]]] = {
    "git": lambda uri: "git+" + uri if uri.startswith(("https://", "http://")) else None,
    "aws": lambda uri: uri if uri.startswith("s3://") else None,
    "wasabi": lambda uri: uri if uri.startswith("s3://") else None,
    "gcp": lambda uri: uri if uri.startswith("gs://") else None,
    "azure": azure_uri,
    "web": lambda uri: uri if uri.startswith(("https://", "http://")) else None,
    "local": lambda uri: uri if not uri.startswith(("~", "$")) and "://" not in uri else None,
}
OWN_STORE: Final = frozenset({"trainml", "proximl"})  # trainML's own models, checkpoints, datasets
BUCKET_OUTPUTS: Final = {"aws": "s3://", "wasabi": "s3://", "gcp": "gs://"}


def is_trainml(doc: Mapping[str, Any]) -> bool:
    environment = doc.get("environment")
    resources = doc.get("resources")
    return (
        not MARKERS.isdisjoint(doc)
        or (isinstance(resources, Mapping) and "gpu_type_id" in resources)
        or (isinstance(environment, Mapping) and ("custom_image" in environment or "type" in environment))
        or (isinstance(environment, Mapping) and isinstance(environment.get("env"), list))
    )


def to_rigbase(doc: Mapping[str, Any]) -> Converted:
    errors: list[tuple[FieldPath, str]] = []
    notes: list[str] = []
    origin: dict[FieldPath, FieldPath] = {}
    name = dns_name(str(doc.get("name") or "job"))
    if name != doc.get("name"):
        notes.append(f"name {name!r} from {doc.get('name')!r} (a rigbase name is a DNS label)")
    data: dict[str, Any] = {"name": name, "type": doc.get("type", "training")}
    data["resources"] = _resources(doc, origin, errors, notes)
    endpoint = doc.get("endpoint")
    serves = isinstance(endpoint, Mapping) and endpoint.get("start_command")
    given = doc.get("workers") or doc.get("worker_commands")
    data["workers"] = _workers(doc, origin, errors) if given or not serves else []
    if len(data["workers"]) > 1:
        data["kind"] = JobKind.INDEPENDENT.value
        notes.append(f"{len(data['workers'])} workers run as independent runs, as trainML runs them")
    data["environment"] = _environment(doc.get("environment"), origin, errors, notes)
    data["data"] = _data(doc.get("data"), name, origin, errors)
    model = _model(doc.get("model"), errors)
    if model is not None:
        data["model"] = model
        origin[("model",)] = ("model", "source_uri")
    if doc.get("endpoint"):
        data.update(_endpoint(doc["endpoint"], data, errors, notes))
    notes += [f"{key}: not a rigbase setting, ignored" for key in doc if key not in KNOWN]
    for key in ("project_uuid", "source_job_uuid"):
        if key in doc:
            notes.append(f"{key}: trainML's own id, ignored (`--project` chooses the project)")
    if errors:
        raise RuleErrors(errors)
    return Converted(data=data, origin=origin, notes=notes)


Errors = list[tuple[FieldPath, str]]
TRAINML_ENDPOINT_PORT = 80  # "The server must listen on port 80"


def _endpoint(given: Any, data: dict[str, Any], errors: Errors, notes: list[str]) -> dict[str, Any]:
    """trainML's manual server command → `endpoint: {port: 80, start_command}` (docs/job-urls.md); its
    built-in server's routes are not run by rigbase."""
    if not isinstance(given, Mapping):
        errors.append((("endpoint",), "must be a mapping"))
        return {}
    if given.get("routes"):
        notes.append("endpoint.routes: trainML's built-in server is not run; give endpoint.start_command")
    command = given.get("start_command")
    if not command:
        return {}
    if data.pop("workers", None):
        notes.append("endpoint.start_command starts the server; the workers' commands are not run")
    return {"endpoint": {"port": TRAINML_ENDPOINT_PORT, "start_command": str(command)}}


def _nested(doc: Mapping[str, Any]) -> Mapping[str, Any]:
    resources = doc.get("resources")
    return resources if isinstance(resources, Mapping) else {}


def _wanted(doc: Mapping[str, Any], origin: dict[FieldPath, FieldPath]) -> list[Any] | None:
    """The GPU ids asked for, wherever the form puts them."""
    nested = _nested(doc)
    for where, value in (
        (("gpu_types",), doc.get("gpu_types")),
        (("gpu_type",), doc.get("gpu_type")),
        (("resources", "gpu_types"), nested.get("gpu_types")),
        (("resources", "gpu_type_id"), nested.get("gpu_type_id")),
    ):
        if value:
            origin[("resources", "gpu_types")] = where
            if isinstance(value, str):
                return [value]
            return value if isinstance(value, list) else None
    return None


def _resources(
    doc: Mapping[str, Any], origin: dict[FieldPath, FieldPath], errors: Errors, notes: list[str]
) -> dict[str, Any]:
    nested = _nested(doc)
    out: dict[str, Any] = {}
    for key in ("gpu_count", "cpu_count", "disk_size", "max_price"):
        for where, section in ((key,), doc), (("resources", key), nested):
            if key in section and section[key] is not None:
                out[key] = section[key]
                origin[("resources", key)] = where
    wanted = _wanted(doc, origin)
    if wanted is None:
        errors.append((("gpu_types",), "required: trainML GPU ids, e.g. [rtx3090], or [cpu]"))
        return out
    types: list[str] = []
    for index, gpu in enumerate(wanted):
        key = str(gpu).strip().lower()
        if key == TRAINML_CPU:
            continue
        try:
            found = TRAINML_GPU_IDS.get(key) or resolve_gpu_type(str(gpu))
        except ValueError as exc:
            errors.append(((*origin[("resources", "gpu_types")], index), str(exc)))
            continue
        types += [t for t in found if t not in types]
    if types:
        out["gpu_types"] = types
        out.setdefault("gpu_count", 1)
    else:  # [cpu]: a CPU-only job
        out["gpu_count"] = 0
    if "max_price" in out and not types:
        del out["max_price"]  # trainML's default max_price is per GPU-hour; a CPU job has none
        notes.append("max_price dropped: a CPU-only job pays no GPU-hour price")
    return out


def _workers(
    doc: Mapping[str, Any], origin: dict[FieldPath, FieldPath], errors: list[tuple[FieldPath, str]]
) -> list[str]:
    key = "workers" if doc.get("workers") else "worker_commands"
    raw = doc.get(key)
    if not isinstance(raw, list) or not raw:
        errors.append(((key,), "required: one command per worker, e.g. [python train.py]"))
        return []
    out: list[str] = []
    for index, item in enumerate(raw):
        command = item.get("command") if isinstance(item, Mapping) else item
        if not isinstance(command, str):
            errors.append(((key, index), "must be a command, or {command: …}"))
            continue
        origin[("workers", len(out))] = (key, index)
        out.append(command)
    return out


def _environment(
    raw: Any, origin: dict[FieldPath, FieldPath], errors: list[tuple[FieldPath, str]], notes: list[str]
) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        return {}
    out: dict[str, Any] = {}
    if raw.get("custom_image"):
        out["image"] = raw["custom_image"]
        origin[("environment", "image")] = ("environment", "custom_image")
    elif raw.get("type"):
        notes.append(
            f"environment.type {raw['type']!r} is trainML's image: the workers run the default image; "
            "give environment.custom_image to choose one"
        )
    env = raw.get("env")
    if isinstance(env, list):
        pairs: dict[str, Any] = {}
        for index, item in enumerate(env):
            if not isinstance(item, Mapping) or "key" not in item:
                errors.append((("environment", "env", index), "must be {key, value}"))
                continue
            pairs[str(item["key"])] = item.get("value", "")
        out["env"] = pairs
    elif isinstance(env, Mapping):
        out["env"] = dict(env)
    origin[("environment", "env")] = ("environment", "env")
    packages = raw.get("packages")
    if isinstance(packages, Mapping):
        out["packages"] = {k: v for k, v in packages.items() if k in ("apt", "conda", "pip") and v}
    _keys(raw.get("worker_key_types"), out, origin, notes)
    return out


def _output(raw: Mapping[str, Any], job: str, errors: list[tuple[FieldPath, str]]) -> dict[str, Any] | None:
    kind, uri = str(raw.get("output_type") or ""), str(raw.get("output_uri") or "")
    if kind in BUCKET_OUTPUTS and uri.startswith(BUCKET_OUTPUTS[kind]):
        options = raw.get("output_options")
        endpoint = options.get("endpoint_url") if isinstance(options, Mapping) else None
        return {
            "uri": uri,
            **({"endpoint_url": str(endpoint)} if endpoint and uri.startswith("s3://") else {}),
        }
    if kind == "azure":
        if converted := azure_uri(uri):
            return {"uri": converted}
        errors.append(
            (
                ("data", "output_uri"),
                f"an output_uri for azure is https://ACCOUNT{AZURE_HOST}/CONTAINER[/PATH]",
            )
        )
        return None
    if kind in OWN_STORE:
        return {"kind": uri or "model", "name": job}
    if kind in BUCKET_OUTPUTS:
        errors.append(
            (("data", "output_uri"), f"an output_uri for {kind} begins with {BUCKET_OUTPUTS[kind]}")
        )
    else:
        errors.append(
            (
                ("data", "output_type"),
                f"output_type {kind!r} is not written: use aws, azure, gcp, wasabi or trainml, or a rigbase "
                "spec's data.output {datastore, path} for a regional datastore",
            )
        )
    return None


def _model(raw: Any, errors: list[tuple[FieldPath, str]]) -> dict[str, str] | None:
    """trainML's model: one of the project's by name or id, or a source `provision job create` makes into
    one (contracts.jobspec.ModelRef.source): git, aws (s3://), gcp (gs://), web, or a local directory."""
    if not raw:
        return None
    kind = str(raw.get("source_type") or "") if isinstance(raw, Mapping) else ""
    uri = str(raw.get("source_uri") or "") if isinstance(raw, Mapping) else ""
    if kind in OWN_STORE and uri:
        return {"name": uri}
    source = MODEL_SOURCES.get(kind, lambda _: None)(uri) if uri else None
    if source is None:
        errors.append(
            (
                ("model",),
                f"source_type {kind!r} with source_uri {uri[:80]!r} is not a model source: use git "
                "(https://…), aws (s3://…), gcp (gs://…), azure (https://ACCOUNT.blob.core.windows.net/…), "
                "web (https://…), local (a directory) or "
                "trainml (a name)",
            )
        )
    return {"source": source} if source else None


def _keys(wanted: Any, out: dict[str, Any], origin: dict[FieldPath, FieldPath], notes: list[str]) -> None:
    """trainML's worker_key_types → environment.keys (the project's `default` key of each kind)."""
    if not isinstance(wanted, list) or not wanted:
        return
    given = [TRAINML_KEY_TYPES[k] for k in wanted if k in TRAINML_KEY_TYPES]
    if given:
        out["keys"] = given
        origin[("environment", "keys")] = ("environment", "worker_key_types")
    dropped = [str(k) for k in wanted if k not in TRAINML_KEY_TYPES]
    if dropped:
        notes.append(f"environment.worker_key_types {', '.join(dropped)}: not given to workers, ignored")


def _data(
    raw: Any, job: str, origin: dict[FieldPath, FieldPath], errors: list[tuple[FieldPath, str]]
) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        return {}
    out: dict[str, Any] = {}
    datasets = raw.get("datasets") or []
    if datasets:
        names: list[Any] = []
        for item in datasets:
            names.append(item.get("name") or item.get("id") if isinstance(item, Mapping) else item)
        out["datasets"] = names
        origin[("data", "datasets")] = ("data", "datasets")
    if raw.get("output_type"):
        output = _output(raw, job, errors)
        if output is not None:
            out["output"] = output
            origin[("data", "output")] = ("data", "output_type")
    if raw.get("input_type") or raw.get("input_uri"):
        kind, uri = str(raw.get("input_type") or ""), str(raw.get("input_uri") or "")
        wanted = INPUT_SCHEMES_OF.get(kind)
        read = azure_uri(uri) if kind == "azure" else uri if wanted and uri.startswith(wanted) else None
        if read is not None:
            out["input"] = {"uri": read}
            origin[("data", "input")] = ("data", "input_uri")
        else:
            errors.append(
                (
                    ("data", "input_type"),
                    f"input_type {kind!r} with input_uri {uri[:80]!r} is not read: use aws or wasabi "
                    f"(s3://…), gcp (gs://…), azure (https://ACCOUNT{AZURE_HOST}/…) or web (https://…), "
                    "or a rigbase spec's data.input "
                    "{datastore, path}",
                )
            )
    return out
