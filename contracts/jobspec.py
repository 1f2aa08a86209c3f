"""The rigbase job spec (docs/job-spec.md): one model every job format becomes.

Field names and rules follow the job configuration of the product this one re-creates (resources, data,
workers, environment): GPU types, a GPU count per worker, vCPUs in multiples of 4 for CPU-only jobs, a
maximum price per GPU-hour, 10 GB-1 TB of disk per worker, datasets mounted under /opt/ml/input, output
written to /opt/ml/output, packages installed apt -> conda -> requirements.txt -> pip.

`JobSpec.model_json_schema()` is the published schema (docs/job-spec.schema.json, checked by a test).
Every rule that spans fields raises `RuleErrors`, which carries the path of each offending field, so an
error line names the field itself ("resources.cpu_count: …"), not the section that holds it.
provisioner/domain/job_formats.py reads the three file formats into this model and adds YAML lines."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from contracts.data_objects import ObjectKind
from contracts.errors import InvalidInput, plain_validation_message
from contracts.gpu_types import GPU_TYPES, resolve_gpu_type
from contracts.identity import DNS_LABEL_PATTERN
from contracts.images import RegistryImage
from contracts.jobs import (
    CHECKPOINT_PATH,
    INPUT_PATH,
    MAX_COMMAND,
    MAX_ENV,
    MAX_ENV_VALUE,
    MODELS_PATH,
    OUTPUT_PATH,
)
from contracts.regional import requested_parts

DISK_MIN_GB: Final = 10
DISK_MAX_GB: Final = 1000  # 1 TB
CPU_STEP: Final = 4  # vCPUs come in fours (CPU-only jobs)
MAX_GPUS_PER_WORKER: Final = 64
MAX_CPUS_PER_WORKER: Final = 4096
MAX_WORKERS: Final = 256
MAX_DATASETS: Final = 32
MAX_PACKAGES: Final = 256
RESERVED_ENV_PREFIX: Final = "RIGBASE_"  # the minion sets RIGBASE_* (job name, worker, output path)

FieldPath = tuple[str | int, ...]  # ("data", "datasets", 2) is data.datasets[2]


class RuleErrors(ValueError):
    """One or more broken rules, each with the path of its field below the validated object, e.g.
    (("cpu_count",), "must be a multiple of 4"). pydantic keeps the exception in the error's context, so
    `spec_errors()` can put each message on its own field."""

    def __init__(self, errors: Sequence[tuple[FieldPath, str]]) -> None:
        self.errors = list(errors)
        super().__init__("; ".join(f"{format_path(path)}: {message}" for path, message in self.errors))


def format_path(path: Iterable[str | int]) -> str:
    """("data", "datasets", 2) -> "data.datasets[2]"."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


class JobType(StrEnum):
    TRAINING = "training"
    INFERENCE = "inference"
    NOTEBOOK = "notebook"
    ENDPOINT = "endpoint"


class JobKind(StrEnum):
    """How a job's workers relate (docs/job-spec.md "Gang and independent jobs")."""

    GANG = "gang"  # distributed training: placed at once in one region, started together, failed whole
    INDEPENDENT = "independent"  # a sweep: each worker placed, run, ended and billed on its own


DEFAULT_GROUP: Final = "worker"  # the group name of the `workers:` shorthand (RIGBASE_GROUP, PAI_* roles)


# Which job types may use a field (the job configuration shows these sections only for these types).
ONLY_FOR: Final[dict[tuple[str, ...], frozenset[JobType]]] = {
    ("workers",): frozenset({JobType.TRAINING}),  # more than one worker: training jobs only
    ("groups",): frozenset({JobType.TRAINING}),
    ("data", "datasets"): frozenset({JobType.TRAINING, JobType.NOTEBOOK}),
    ("data", "input"): frozenset({JobType.INFERENCE}),
    ("data", "output"): frozenset({JobType.TRAINING, JobType.INFERENCE}),
    ("reservation",): frozenset({JobType.ENDPOINT, JobType.NOTEBOOK}),
    ("endpoint",): frozenset({JobType.ENDPOINT}),
    ("autostop_minutes",): frozenset({JobType.NOTEBOOK, JobType.ENDPOINT}),
}
NOTEBOOK_AUTOSTOP_MINUTES: Final = (
    60  # a notebook's default (a project may set its own); an endpoint's is never
)
AUTOSTOP_MAX_MINUTES: Final = 30 * 24 * 60

_GpuTypeName = Annotated[str, WithJsonSchema({"type": "string", "enum": list(GPU_TYPES)})]
_Package = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[^\s]+$")]
_EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")]
_DnsLabel = Annotated[str, Field(min_length=1, max_length=63, pattern=f"^{DNS_LABEL_PATTERN}$")]


class _Section(BaseModel):
    # a misspelt field is an error, never silently a default
    model_config = ConfigDict(extra="forbid", frozen=True)


class Resources(_Section):
    """What each worker gets."""

    gpu_types: list[_GpuTypeName] = Field(
        default_factory=list,
        description="GPU types that satisfy the job (any of them); catalogue names, other spellings accepted",
    )
    gpu_count: int = Field(1, ge=0, le=MAX_GPUS_PER_WORKER, description="GPUs per worker; 0 = CPU only")
    cpu_count: int | None = Field(
        None,
        ge=CPU_STEP,
        le=MAX_CPUS_PER_WORKER,
        description="vCPUs per worker, a multiple of 4: required for CPU-only jobs, a minimum otherwise",
    )
    max_price: float | None = Field(None, gt=0, le=10_000, description="maximum credits per GPU-hour")
    disk_size: int = Field(DISK_MIN_GB, ge=DISK_MIN_GB, le=DISK_MAX_GB, description="GB of disk per worker")

    @field_validator("gpu_types", mode="before")
    @classmethod
    def _catalogue_names(cls, value: Any) -> Any:
        if isinstance(value, str):  # one type may be given without a list
            value = [value]
        if not isinstance(value, list):
            return value  # pydantic says what is wrong with it
        names: list[str] = []
        errors: list[tuple[FieldPath, str]] = []
        for index, item in enumerate(value):
            if not isinstance(item, str):
                errors.append(((index,), "must be a GPU type name, e.g. RTX 3090"))
                continue
            try:
                names += [n for n in resolve_gpu_type(item) if n not in names]
            except ValueError as exc:
                errors.append(((index,), str(exc)))
        if errors:
            raise RuleErrors(errors)
        return names

    @field_validator("cpu_count")
    @classmethod
    def _fours(cls, value: int | None) -> int | None:
        if value is not None and value % CPU_STEP:
            low = value - value % CPU_STEP
            raise ValueError(f"must be a multiple of {CPU_STEP}, e.g. {low or CPU_STEP} or {low + CPU_STEP}")
        return value

    @model_validator(mode="after")
    def _cpu_or_gpu(self) -> Resources:
        errors: list[tuple[FieldPath, str]] = []
        if self.gpu_count == 0:
            if self.gpu_types:
                errors.append((("gpu_types",), "a CPU-only job (gpu_count 0) lists no GPU type; remove it"))
            if self.cpu_count is None:
                errors.append((("cpu_count",), "required for a CPU-only job (gpu_count 0): a multiple of 4"))
            if self.max_price is not None:
                errors.append((("max_price",), "is a price per GPU-hour; a CPU-only job has none, remove it"))
        elif not self.gpu_types:
            errors.append(
                (("gpu_types",), "name at least one GPU type, e.g. [RTX 3090], or set gpu_count: 0")
            )
        if errors:
            raise RuleErrors(errors)
        return self

    @property
    def cpu_only(self) -> bool:
        return self.gpu_count == 0


class Packages(_Section):
    """Installed before each worker's command, in this order: apt, conda, requirements.txt, pip."""

    apt: list[_Package] = Field(default_factory=list, max_length=MAX_PACKAGES, description="pin: pkg=version")
    conda: list[_Package] = Field(
        default_factory=list, max_length=MAX_PACKAGES, description="pin: pkg=version"
    )
    requirements: str | None = Field(
        None,
        min_length=1,
        max_length=1024,
        pattern=r"^[^\s]+$",
        description="a requirements file (relative to the working directory), installed with pip -r if found",
    )
    pip: list[_Package] = Field(
        default_factory=list, max_length=MAX_PACKAGES, description="pin: pkg==version"
    )

    def install_commands(self) -> list[str]:
        """The shell lines that install the packages, in the documented order (none when nothing is asked)."""
        quote = " ".join
        lines: list[str] = []
        if self.apt:
            lines += [
                "apt-get update -qq",
                f"DEBIAN_FRONTEND=noninteractive apt-get install -y -qq {quote(map(shlex.quote, self.apt))}",
            ]
        if self.conda:
            lines.append(f"conda install -y -q {quote(map(shlex.quote, self.conda))}")
        if self.requirements:
            req = shlex.quote(self.requirements)
            lines.append(f"if [ -f {req} ]; then pip install -q -r {req}; fi")
        if self.pip:
            lines.append(f"pip install -q {quote(map(shlex.quote, self.pip))}")
        return lines


DEFAULT_IMAGE: Final = "docker.io/library/python:3.12-slim"
# a notebook job's image when its spec names none: Project Jupyter's own, which brings JupyterLab
DEFAULT_NOTEBOOK_IMAGE: Final = "quay.io/jupyter/minimal-notebook:python-3.12"
NOTEBOOK_PORT: Final = 8888  # where a notebook job's JupyterLab listens in its container


class SecretValue(_Section):
    """An environment value sealed at rest (`HF_TOKEN: {value: hf_..., secret: true}`): the store keeps it
    sealed, every answer shows the name only, and it goes to a node only with a running assignment."""

    value: str | None = Field(
        None,
        max_length=MAX_ENV_VALUE,
        repr=False,
        description="the value; required when the job is submitted, absent from every answer",
    )
    secret: Literal[True]


# The variables a project key of each kind becomes in a worker that names it (environment.keys): the
# names each tool reads by itself. (key id, secret); None: that half is not given.
KEY_VARIABLES: Final[dict[str, tuple[str | None, str]]] = {
    "aws": ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"),
    "azure": ("AZURE_STORAGE_ACCOUNT", "AZURE_STORAGE_KEY"),
    "huggingface": (None, "HF_TOKEN"),
    "kaggle": ("KAGGLE_USERNAME", "KAGGLE_KEY"),
    "wandb": (None, "WANDB_API_KEY"),
}
_KeyRef = Annotated[
    str, Field(pattern=r"^(aws|azure|huggingface|kaggle|wandb)(/[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)?$")
]


class Environment(_Section):
    image: RegistryImage = Field(
        DEFAULT_IMAGE,
        min_length=1,
        max_length=512,
        description="OCI image of every worker: a registry reference (contracts/images.py)",
    )
    env: dict[_EnvName, Annotated[str, Field(max_length=MAX_ENV_VALUE)] | SecretValue] = Field(
        default_factory=dict,
        max_length=MAX_ENV,
        description="environment variables, shared by all workers; a secret one as {value, secret: true}",
    )
    packages: Packages = Field(default_factory=Packages)
    keys: list[_KeyRef] = Field(
        default_factory=list,
        max_length=len(KEY_VARIABLES),
        description="project keys given to every worker as the variables their tools read: KIND[/NAME]",
    )

    @field_validator("keys")
    @classmethod
    def _one_per_kind(cls, value: list[str]) -> list[str]:
        kinds = [k.split("/", 1)[0] for k in value]
        if len(set(kinds)) != len(kinds):
            raise ValueError("one key of each kind: its variables would be set twice")
        return value

    @field_validator("env", mode="before")
    @classmethod
    def _values_as_text(cls, value: Any) -> Any:
        # `PORT: 8080` and `DEBUG: true` in YAML are meant as the text a process sees
        if not isinstance(value, dict):
            return value
        return {
            key: (str(item).lower() if isinstance(item, bool) else str(item))
            if isinstance(item, (bool, int, float))
            else item
            for key, item in value.items()
        }

    @field_validator("env")
    @classmethod
    def _not_reserved(cls, value: dict[str, Any]) -> dict[str, Any]:
        taken = [name for name in value if name.upper().startswith(RESERVED_ENV_PREFIX)]
        if taken:
            raise RuleErrors(
                [((name,), f"names starting with {RESERVED_ENV_PREFIX} are set by rigbase") for name in taken]
            )
        return value


def _from_root(value: str) -> str:
    try:
        requested_parts(value)
    except InvalidInput as exc:
        raise ValueError(exc.message) from None
    if not value.startswith("/"):
        raise ValueError(f"must begin with / (from the datastore root), e.g. /{value}")
    return value


OUTPUT_SCHEMES: Final = ("s3://", "gs://", "azure://")
INPUT_SCHEMES: Final = ("s3://", "gs://", "azure://", "https://", "http://")
ENDPOINT_SCHEMES: Final = ("s3://", "azure://")  # a URI that may name its own endpoint


class Input(_Section):
    """An inference job's input at /opt/ml/input: a datastore path, or a one-time download of `uri`
    (s3://, gs://, azure://, https://; an archive is unpacked) that the job waits for and that is removed
    when the job ends (docs/data.md, "Inference input")."""

    datastore: _DnsLabel | None = Field(None, description="a regional datastore, mounted read-only")
    path: str = Field("/", min_length=1, max_length=4096, description="below the datastore's root")
    uri: str | None = Field(
        None, max_length=2048, description="s3://…, gs://…, azure://ACCOUNT/CONTAINER/…, https://…, http://…"
    )
    key: _DnsLabel | None = Field(None, description="the project key that reads `uri`; else its `default`")
    endpoint_url: str | None = Field(
        None, max_length=2048, description="an S3-compatible store's endpoint, or another blob endpoint"
    )

    _path = field_validator("path")(classmethod(lambda cls, value: _from_root(value)))

    @model_validator(mode="after")
    def _one_place(self) -> Input:
        rules: list[tuple[bool, str]] = [
            ((self.datastore is None) == (self.uri is None), "give a datastore (and path), or a uri"),
            (
                self.uri is not None and not self.uri.startswith(INPUT_SCHEMES),
                "a uri is s3://, gs://, azure://, https://",
            ),
            (
                self.uri is None and (self.key, self.endpoint_url) != (None, None),
                "key and endpoint_url go with a uri",
            ),
            (
                self.endpoint_url is not None and not (self.uri or "").startswith(ENDPOINT_SCHEMES),
                "endpoint_url is for s3:// and azure://",
            ),
            (self.path != "/" and self.datastore is None, "path goes with a datastore"),
        ]
        for broken, message in rules:
            if broken:
                raise ValueError(message)
        return self


class Output(_Section):
    """Where a worker's /opt/ml/output goes (docs/data.md, "Outputs"): a datastore path mounted there, or,
    when the worker ends, a zip at a bucket URI (`JOB.zip`, `JOB_WORKER.zip` for several workers), or a new
    dataset, model or checkpoint of the project. Always also kept for `provision job output`."""

    datastore: _DnsLabel | None = Field(None, description="a regional datastore, mounted at /opt/ml/output")
    path: str = Field("/", min_length=1, max_length=4096, description="below the datastore's root")
    uri: str | None = Field(
        None,
        max_length=2048,
        description="s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or azure://ACCOUNT/CONTAINER/PREFIX",
    )
    key: _DnsLabel | None = Field(None, description="the project key that writes `uri`; else its `default`")
    endpoint_url: str | None = Field(
        None, max_length=2048, description="an S3-compatible store's endpoint, or another blob endpoint"
    )
    kind: ObjectKind | None = Field(None, description="dataset, model or checkpoint: a new one named `name`")
    name: Annotated[str, Field(min_length=1, max_length=120)] | None = Field(
        None, description="the new object's name (several workers: NAME_WORKER each)"
    )

    _path = field_validator("path")(classmethod(lambda cls, value: _from_root(value)))

    def _bucket_uri(self) -> bool:
        parts = (self.uri or "").split("/")
        named = len(parts) >= 3 and bool(parts[2])
        if (self.uri or "").startswith("azure://"):  # an account, then a container
            named = named and len(parts) >= 4 and bool(parts[3])
        return (self.uri or "").startswith(OUTPUT_SCHEMES) and named

    @model_validator(mode="after")
    def _one_place(self) -> Output:
        given = [self.datastore, self.uri, self.name]
        rules: list[tuple[bool, str]] = [  # (broken, what to write instead), in the order they are told
            (
                sum(v is not None for v in given) != 1,
                "give one of datastore (and path), uri, or kind and name",
            ),
            (
                self.uri is not None and not self._bucket_uri(),
                "write uri as s3://BUCKET[/PREFIX], gs://BUCKET[/PREFIX] or azure://ACCOUNT/CONTAINER[/PREFIX]",
            ),
            (
                self.uri is None and (self.key, self.endpoint_url) != (None, None),
                "key and endpoint_url go with a uri",
            ),
            (
                self.endpoint_url is not None and not (self.uri or "").startswith(ENDPOINT_SCHEMES),
                "endpoint_url is for s3:// and azure://",
            ),
            (
                self.name is not None and self.kind is None,
                "name a new object's kind: dataset, model or checkpoint",
            ),
            (self.name is None and self.kind is not None, "kind goes with name"),
            (
                self.name is not None and ("/" in self.name or not self.name.isprintable()),
                "a name has no '/'",
            ),
            (self.path != "/" and self.datastore is None, "path goes with a datastore"),
        ]
        for broken, message in rules:
            if broken:
                raise ValueError(message)
        return self


def dataset_dir(name: str) -> str:
    """A dataset's directory name when several are mounted: its name with spaces as underscores."""
    return name.replace(" ", "_")


class ModelRef(_Section):
    """The job's model (trainml-job-configuration.txt's `model`): one of the project's models by name, or
    a source `provision job create` makes the model from first (a local directory it uploads, a git, s3,
    gs or web URI it has read), naming it in the job it sends."""

    name: Annotated[str, Field(min_length=1, max_length=128)] | None = Field(
        None, description="a model of the project (`provision model create NAME --source …`)"
    )
    source: Annotated[str, Field(min_length=1, max_length=4096)] | None = Field(
        None, description="./DIR (next to the spec file), git+https://…[@REF], s3://…, gs://…, https://…"
    )

    @model_validator(mode="after")
    def _one(self) -> ModelRef:
        if (self.name is None) == (self.source is None):
            raise ValueError("give the model's name, or its source")
        return self


class DataRole(StrEnum):
    DATASET = "dataset"  # read-only, /opt/ml/input[/NAME]
    MODEL = "model"  # read-only, /opt/ml/models
    CHECKPOINT = "checkpoint"  # read-only, /opt/ml/checkpoint[/NAME]
    INPUT = "input"  # read-only, /opt/ml/input
    OUTPUT = "output"  # read-write, /opt/ml/output


class DataMount(BaseModel):
    """Where one piece of a job's data appears in every worker's container."""

    model_config = ConfigDict(frozen=True)

    role: DataRole
    name: str  # the dataset's, model's or checkpoint's name, or the datastore's
    datastore: str | None  # None for a dataset, model or checkpoint (the jobs service resolves it)
    path: str  # below the datastore root ("/" for a dataset)
    target: str
    read_only: bool


class Data(_Section):
    datasets: list[Annotated[str, Field(min_length=1, max_length=128)]] = Field(
        default_factory=list,
        max_length=MAX_DATASETS,
        description="one: mounted at /opt/ml/input; several: /opt/ml/input/NAME_WITH_UNDERSCORES each",
    )
    checkpoints: list[Annotated[str, Field(min_length=1, max_length=128)]] = Field(
        default_factory=list,
        max_length=MAX_DATASETS,
        description="one: at /opt/ml/checkpoint; several: /opt/ml/checkpoint/NAME_WITH_UNDERSCORES each",
    )
    input: Input | None = Field(None, description="mounted read-only at /opt/ml/input (inference jobs)")
    output: Output | None = Field(
        None, description="where /opt/ml/output goes (RIGBASE_OUTPUT_PATH in each worker)"
    )

    @field_validator("datasets", "checkpoints")
    @classmethod
    def _distinct_dirs(cls, value: list[str], info: ValidationInfo) -> list[str]:
        errors: list[tuple[FieldPath, str]] = []
        seen: dict[str, str] = {}
        what, base = (
            ("dataset", INPUT_PATH) if info.field_name == "datasets" else ("checkpoint", CHECKPOINT_PATH)
        )
        for index, name in enumerate(value):
            if not name.isprintable() or "/" in name or name.strip() in ("", ".", ".."):
                errors.append(((index,), f"{name!r} is not a {what} name (no '/', no control characters)"))
            elif dataset_dir(name) in seen:
                other = seen[dataset_dir(name)]
                errors.append(
                    ((index,), f"{name!r} and {other!r} would both mount at {base}/{dataset_dir(name)}")
                )
            else:
                seen[dataset_dir(name)] = name
        if errors:
            raise RuleErrors(errors)
        return value

    @model_validator(mode="after")
    def _one_input(self) -> Data:
        if self.datasets and self.input is not None:
            raise RuleErrors(
                [(("input",), f"datasets and input both mount at {INPUT_PATH}: use one of them")]
            )
        return self

    def mounts(self, model: str | None = None) -> list[DataMount]:
        """Every data mount of a worker, with its container path (`model`: the job's model's name)."""

        def objects(role: DataRole, names: list[str], base: str) -> list[DataMount]:
            several = len(names) > 1
            return [
                DataMount(
                    role=role,
                    name=name,
                    datastore=None,
                    path="/",
                    target=f"{base}/{dataset_dir(name)}" if several else base,
                    read_only=True,
                )
                for name in names
            ]

        out = objects(DataRole.DATASET, self.datasets, INPUT_PATH)
        out += objects(DataRole.MODEL, [model] if model else [], MODELS_PATH)
        out += objects(DataRole.CHECKPOINT, self.checkpoints, CHECKPOINT_PATH)
        if self.input is not None:
            out.append(  # a uri input is the job's own download (datastore None: the server names it)
                DataMount(
                    role=DataRole.INPUT,
                    name=self.input.datastore or "input",
                    datastore=self.input.datastore,
                    path=self.input.path,
                    target=INPUT_PATH,
                    read_only=True,
                )
            )
        if self.output is not None and self.output.datastore is not None:
            out.append(
                DataMount(
                    role=DataRole.OUTPUT,
                    name=self.output.datastore,
                    datastore=self.output.datastore,
                    path=self.output.path,
                    target=OUTPUT_PATH,
                    read_only=False,
                )
            )
        return out


_Command = Annotated[str, Field(min_length=1, max_length=MAX_COMMAND)]
# an OpenPAI task role's name as it is written (`ps_server`, `Worker`); in a variable's name a '-' is '_'
_GroupName = Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[A-Za-z][A-Za-z0-9_-]{0,62}$")]


class WorkerGroup(_Section):
    """A group of alike workers (OpenPAI's task role): its own command and, when it needs other resources
    than the job's, its own."""

    name: _GroupName = Field(description="unique in the job: RIGBASE_GROUP and OpenPAI's task role name")
    count: int = Field(1, ge=1, le=MAX_WORKERS, description="how many workers run this group's command")
    command: _Command = Field(description="the shell command every worker of the group runs")
    resources: Resources | None = Field(None, description="each worker's resources; none: the job's")

    @field_validator("command")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("is empty: give the command this group's workers run")
        return value


@dataclass(frozen=True)
class PlannedWorker:
    """One worker of a job as it will run: its number, group, place in the group, script and resources."""

    index: int
    group: str
    group_index: int
    command: str
    resources: Resources


class Endpoint(_Section):
    """An endpoint job's server (docs/job-urls.md): what its URL reaches and when it is ready."""

    port: int = Field(ge=1, le=65535, description="the port the server listens on in its container")
    start_command: _Command | None = Field(
        None, description="the command that starts the server (instead of `workers`)"
    )
    health_path: str = Field(
        "/",
        max_length=512,
        pattern=r"^/[^\s]*$",
        description="the job is running once GET on this path answers below 500",
    )
    public: bool = Field(
        False, description="true: anyone with the URL may call it; false: a token of the project"
    )


class JobSpec(_Section):
    """A job as rigbase runs it. Converted specs (ChainOpera Launch, OpenPAI) become this too."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        title="rigbase job spec",
    )

    name: _DnsLabel = Field(description="1-63 lowercase letters, digits and hyphens")
    type: JobType = JobType.TRAINING
    kind: JobKind | None = Field(
        None,
        description="gang (placed whole, started together, failed whole; the default) or independent "
        "(each worker placed, run, ended and billed on its own: a sweep)",
    )
    resources: Resources | None = Field(
        None, description="each worker's; required unless every group has its own"
    )
    workers: list[_Command] | None = Field(
        None,
        min_length=1,
        max_length=MAX_WORKERS,
        description="one shell command per worker, run with /bin/sh -c (or `groups`)",
    )
    groups: list[WorkerGroup] | None = Field(
        None,
        min_length=1,
        max_length=MAX_WORKERS,
        description="groups of workers, each with its own resources",
    )
    environment: Environment = Field(default_factory=Environment)
    data: Data = Field(default_factory=Data)
    model: ModelRef | None = Field(None, description="a model of the project, mounted at /opt/ml/models")
    reservation: _DnsLabel | None = Field(None, description="a regional port reservation the job serves on")
    endpoint: Endpoint | None = Field(None, description="an endpoint job's server: port, start, health")
    autostop_minutes: int | None = Field(
        None,
        ge=0,
        le=AUTOSTOP_MAX_MINUTES,
        description="a notebook or endpoint idle this long is stopped (0: never); default: the project's "
        "notebook autostop, else 60 for a notebook (no kernel activity, no connection), never for an "
        "endpoint (no request through its URL)",
    )
    region: _DnsLabel | None = Field(None, description="run only in this region")
    preemptible: bool = Field(
        False,
        description="may run on preemptible (GCP Spot) capacity: cheaper, but Google may take it back; "
        "a preempted training job is re-queued once, any other job fails",
    )

    @model_validator(mode="before")
    @classmethod
    def _notebook_image(cls, data: Any) -> Any:
        """A notebook that names no image gets one that brings JupyterLab."""
        if not isinstance(data, dict) or data.get("type") != JobType.NOTEBOOK.value:
            return data
        environment = data.get("environment")
        if environment is None or (isinstance(environment, dict) and "image" not in environment):
            data = {**data, "environment": {**(environment or {}), "image": DEFAULT_NOTEBOOK_IMAGE}}
        return data

    @field_validator("workers", mode="before")
    @classmethod
    def _one_command(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value  # a single worker may be written as one string

    @field_validator("workers")
    @classmethod
    def _not_blank(cls, value: list[str] | None) -> list[str] | None:
        blank = [
            ((i,), "is empty: give the command this worker runs")
            for i, cmd in enumerate(value or [])
            if not cmd.strip()
        ]
        if blank:
            raise RuleErrors(blank)
        return value

    @field_validator("groups")
    @classmethod
    def _distinct_groups(cls, value: list[WorkerGroup] | None) -> list[WorkerGroup] | None:
        errors: list[tuple[FieldPath, str]] = []
        seen: set[str] = set()
        for i, group in enumerate(value or []):
            if group.name in seen:
                errors.append(
                    ((i, "name"), f"group {group.name!r} is named twice: give each group its own name")
                )
            seen.add(group.name)
        total = sum(g.count for g in value or [])
        if total > MAX_WORKERS:
            errors.append(((), f"the groups have {total} workers; a job has at most {MAX_WORKERS}"))
        if errors:
            raise RuleErrors(errors)
        return value

    @model_validator(mode="after")
    def _one_form(self) -> JobSpec:
        errors: list[tuple[FieldPath, str]] = []
        starts = self.endpoint is not None and self.endpoint.start_command is not None
        if starts and (self.workers is not None or self.groups is not None):
            errors.append((("endpoint", "start_command"), "give `start_command` or `workers`, not both"))
        elif self.workers is None and self.groups is None and self.resources is None:
            errors.append((("resources",), "required: what each worker gets (gpu_types, gpu_count, …)"))
        elif self.workers is None and self.groups is None and not (starts or self.type is JobType.NOTEBOOK):
            errors.append((("workers",), "required: one command per worker (or `groups`)"))
        elif self.workers is not None and self.groups is not None:
            errors.append((("groups",), "give `workers` or `groups`, not both"))
        elif self.resources is None and self.groups is None:
            errors.append((("resources",), "required: what each worker gets (gpu_types, gpu_count, …)"))
        elif self.resources is None:
            errors += [
                (("groups", i, "resources"), "required: the job has no `resources` for this group to use")
                for i, g in enumerate(self.groups or [])
                if g.resources is None
            ]
        if errors:
            raise RuleErrors(errors)
        return self

    @model_validator(mode="after")
    def _type_rules(self) -> JobSpec:
        used = {
            ("workers",): self.worker_count > 1 and self.groups is None,
            ("groups",): self.groups is not None and self.worker_count > 1,
            ("data", "datasets"): bool(self.data.datasets),
            ("data", "input"): self.data.input is not None,
            ("data", "output"): self.data.output is not None,
            ("reservation",): self.reservation is not None,
            ("endpoint",): self.endpoint is not None,
            ("autostop_minutes",): self.autostop_minutes is not None,
        }
        errors: list[tuple[FieldPath, str]] = []
        for path, types in ONLY_FOR.items():
            if used[path] and self.type not in types:
                allowed = " and ".join(sorted(types))
                what = "more than one worker" if path in (("workers",), ("groups",)) else "this field"
                errors.append((path, f"only {allowed} jobs may use {what} (this job is {self.type.value})"))
        if errors:
            raise RuleErrors(errors)
        return self

    @property
    def worker_count(self) -> int:
        if self.groups is not None:
            return sum(g.count for g in self.groups)
        return len(self.commands)

    @property
    def commands(self) -> list[str]:
        """The `workers` commands; else the endpoint's start_command, or for a notebook nothing before
        JupyterLab starts (an empty command)."""
        if self.workers is not None:
            return self.workers
        if self.endpoint is not None and self.endpoint.start_command is not None:
            return [self.endpoint.start_command]
        return [""] if self.type is JobType.NOTEBOOK and self.groups is None else []

    @property
    def autostop(self) -> int:
        """Minutes idle before the job is stopped; 0: never."""
        if self.autostop_minutes is not None:
            return self.autostop_minutes
        return NOTEBOOK_AUTOSTOP_MINUTES if self.type is JobType.NOTEBOOK else 0

    @property
    def serve_port(self) -> int | None:
        """The container port a notebook's or endpoint's URL reaches (NOTEBOOK_PORT for a notebook)."""
        if self.type is JobType.NOTEBOOK:
            return NOTEBOOK_PORT
        return self.endpoint.port if self.endpoint is not None else None

    @property
    def job_kind(self) -> JobKind:
        """The kind given, else gang: nothing of a job runs until all of it can (a sweep says so)."""
        return self.kind or JobKind.GANG

    def plan(self) -> list[PlannedWorker]:
        """Every worker in order (index = worker number = rank): its group, its place in the group, its
        script (the package installs, stopping at the first failure, then its own command under the
        shell's usual rules) and its resources."""
        setup = self.environment.packages.install_commands()

        def script(command: str) -> str:
            return "\n".join(["set -e", *setup, "set +e", command]) if setup else command

        if self.groups is None:
            assert self.resources is not None  # _one_form
            return [
                PlannedWorker(i, DEFAULT_GROUP, i, script(command), self.resources)
                for i, command in enumerate(self.commands)
            ]
        out: list[PlannedWorker] = []
        for group in self.groups:
            resources = group.resources or self.resources
            assert resources is not None  # _one_form
            for k in range(group.count):
                out.append(PlannedWorker(len(out), group.name, k, script(group.command), resources))
        return out

    def worker_commands(self) -> list[str]:
        """The shell script of each worker (index = worker number)."""
        return [w.command for w in self.plan()]

    def mounts(self) -> list[DataMount]:
        """A model given by its source mounts once `provision job create` has named it."""
        return self.data.mounts(self.model.name if self.model is not None else None)

    def datastores(self) -> list[str]:
        """The regional datastores the job uses (each pins the job to its region)."""
        used = [self.data.input, self.data.output]
        return list(dict.fromkeys(p.datastore for p in used if p is not None and p.datastore is not None))

    @property
    def input_path(self) -> str:
        return INPUT_PATH

    @property
    def output_path(self) -> str:
        return OUTPUT_PATH


ERROR_LINE_MAX: Final = 1000


def _one_line(text: str) -> str:
    """An error line quotes the file (a key, a GPU type): a newline in it would print a forged second line and
    a megabyte in it a megabyte of error, so control characters are escaped and the line is bounded."""
    escaped = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)
    return (
        escaped
        if len(escaped) <= ERROR_LINE_MAX
        else f"{escaped[:ERROR_LINE_MAX]}…(+{len(escaped) - ERROR_LINE_MAX} chars)"
    )


class SpecError(InvalidInput):
    """A job spec that cannot run: one line per error, each naming the field (and the file line)."""

    default_code = "invalid_job_spec"

    def __init__(self, errors: Sequence[str]) -> None:
        self.errors = [_one_line(error) for error in errors]
        super().__init__("\n".join(self.errors))

    def to_json(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "errors": self.errors}


# pydantic's error types in the operator's words ({...} from the error's context)
_MESSAGES: Final[dict[str, str]] = {
    "missing": "required",
    "extra_forbidden": "unknown field",
    "greater_than_equal": "must be at least {ge}",
    "less_than_equal": "must be at most {le}",
    "greater_than": "must be more than {gt}",
    "less_than": "must be less than {lt}",
    "int_parsing": "must be a whole number",
    "int_type": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_parsing": "must be a number",
    "float_type": "must be a number",
    "string_type": "must be a string",
    "list_type": "must be a list",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping",
    "model_attributes_type": "must be a mapping",
    "too_short": "needs at least {min_length}",
    "too_long": "takes at most {max_length}",
    "string_too_short": "must not be empty",
    "string_too_long": "must be at most {max_length} characters",
}

_RANGE_ERRORS: Final = frozenset({"greater_than_equal", "less_than_equal", "greater_than", "less_than"})
_RANGES: Final[dict[str, str]] = {
    "disk_size": f"must be {DISK_MIN_GB} to {DISK_MAX_GB} GB (10 GB to 1 TB)",
    "cpu_count": f"must be {CPU_STEP} to {MAX_CPUS_PER_WORKER} vCPUs, a multiple of {CPU_STEP}",
    "gpu_count": f"must be 0 (CPU only) to {MAX_GPUS_PER_WORKER} GPUs per worker",
    "max_price": "must be a price per GPU-hour above 0, e.g. 1.5",
}

_PATTERN_HINTS: Final[dict[str, str]] = {
    f"^{DNS_LABEL_PATTERN}$": "must be 1-63 lowercase letters, digits and hyphens, starting and ending "
    "with a letter or digit",
    r"^[A-Za-z_][A-Za-z0-9_]{0,127}$": "must be a variable name: letters, digits and _, not starting "
    "with a digit",
    r"^[^\s]+$": "must not contain spaces",
    r"^[A-Za-z][A-Za-z0-9_-]{0,62}$": "must be 1-63 letters, digits, '_' and '-', starting with a letter",
}


def _fields_at(loc: FieldPath) -> list[str]:
    """The field names of the section at `loc` (for "unknown field" errors)."""
    model: type[BaseModel] = JobSpec
    for part in loc:
        if isinstance(part, int):
            continue
        annotation = model.model_fields[part].annotation if part in model.model_fields else None
        candidates = [annotation, *getattr(annotation, "__args__", ())]
        candidates += [arg for c in candidates for arg in getattr(c, "__args__", ())]  # list[Group] | None
        section = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if section is None:
            return []
        model = section
    return list(model.model_fields)


def spec_errors(exc: ValidationError) -> list[tuple[FieldPath, str]]:
    """Each error of a failed validation as (field path, message in the operator's words)."""
    out: list[tuple[FieldPath, str]] = []
    for err in exc.errors():
        loc = tuple(part for part in err["loc"] if part != "[key]")  # a mapping key's own error: its path
        ctx = err.get("ctx") or {}
        cause = ctx.get("error")
        if isinstance(cause, RuleErrors):
            out += [(loc + sub, message) for sub, message in cause.errors]
            continue
        kind = err["type"]
        if kind == "extra_forbidden":
            message = f"unknown field; allowed here: {', '.join(_fields_at(loc[:-1]))}"
        elif kind == "string_pattern_mismatch":
            message = _PATTERN_HINTS.get(str(ctx.get("pattern")), f"must match {ctx.get('pattern')}")
        elif kind == "enum":
            message = f"must be one of {ctx.get('expected', '')}".replace("'", "")
        elif kind in _RANGE_ERRORS and loc and loc[-1] in _RANGES:
            message = _RANGES[str(loc[-1])]
        elif kind in _MESSAGES:
            message = _MESSAGES[kind].format(**{k: v for k, v in ctx.items() if isinstance(k, str)})
        else:
            message = plain_validation_message(str(err["msg"]))
        out.append((loc, message))
    return out


def spec_from_data(data: Any) -> JobSpec:
    """A JobSpec from parsed JSON/YAML data; SpecError with one line per error (no file lines: use
    provisioner.domain.job_formats.parse for text)."""
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError([f"{format_path(p) or 'spec'}: {m}" for p, m in spec_errors(exc)]) from None


def schema_json() -> str:
    """The published JSON Schema (docs/job-spec.schema.json is this text; a test keeps them equal)."""
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", **JobSpec.model_json_schema()}
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"
