"""Jobs on a node, as both ends agree on it (docs/minion-jobs.md).

The control plane never opens a connection to a node. Every heartbeat answer carries the node's share of
the fleet's jobs under `desired["jobs"]` (a JobsDesired): one WorkerAssignment per container the node must
run (a job with several workers may put several on one node). The minion runs each as a rootful podman
container and reports every worker it knows under `actual["jobs"]` (a JobsActual) on the next heartbeat.

A worker is named by (job_id, worker); `generation` names one attempt of it (the control plane changes it to
run a worker again), so a container of another generation is stopped and replaced, never adopted. A worker
the desired state no longer lists is stopped and forgotten once its last report was sent. `stop: true`
asks for SIGTERM, `stop_grace_s` seconds, then SIGKILL.

Logs: the minion posts each worker's combined stdout/stderr, in order, to LOG_ROUTE as LogChunks. `offset`
is the byte offset of the chunk's first byte in the worker's output (utf-8); the control plane stores chunks
idempotently by offset and answers with LogAck(acked) = the number of bytes it now holds contiguously from
0. The minion keeps the acked offset on its state partition and resends from there after a restart of
either side, so no byte is lost or stored twice. `eof` marks the chunk after which the output is complete
(the container ended and everything before it was acked)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from pathlib import PurePosixPath
from typing import Annotated, Any, Final

from pydantic import Field, SerializerFunctionWrapHandler, field_validator, model_serializer, model_validator

from contracts.errors import InvalidInput
from contracts.images import RegistryHost, RegistryImage
from contracts.messages import ControlPlaneMessage, MinionMessage
from contracts.regional import DatastoreType, Protocol, check_datastore, requested_parts

LOG_ROUTE: Final = "/v1/nodes/{node_id}/jobs/{job_id}/workers/{worker}/logs"
OUTPUT_PATH: Final = "/opt/ml/output"  # RIGBASE_OUTPUT_PATH inside every container
INPUT_PATH: Final = "/opt/ml/input"
MODELS_PATH: Final = "/opt/ml/models"
CHECKPOINT_PATH: Final = "/opt/ml/checkpoint"

# the ports a worker's peers reach it on (RIGBASE_PORT, MASTER_PORT for rank 0): torchrun's default first,
# one per live worker of a node (a node runs at most MAX_WORKERS_PER_NODE)
PEER_PORT_FIRST: Final = 29500
MAX_WORKERS_PER_NODE: Final = 64  # actual["jobs"] must fit the heartbeat's 32 KiB report bound
PEER_PORTS: Final = range(PEER_PORT_FIRST, PEER_PORT_FIRST + MAX_WORKERS_PER_NODE)
MAX_MOUNTS: Final = 32
MAX_PEERS: Final = 256  # a gang's other workers (contracts.jobspec.MAX_WORKERS)
MAX_ENV: Final = 256
# the spec's variables and rigbase's: its own, torchrun's, and OpenPAI's three per peer of a gang
MAX_ASSIGNMENT_ENV: Final = MAX_ENV + 64 + 3 * 256
MAX_ENV_VALUE: Final = 32 * 1024
MAX_COMMAND: Final = 64 * 1024
MAX_PATH: Final = 4096
MESSAGE_MAX: Final = 1000
LOG_CHUNK_MAX: Final = 256 * 1024  # bytes of utf-8 in one LogChunk; the minion sends at most this much

# Ids become container names, label values and directory names on the node: a safe alphabet, bounded.
JobId = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
Generation = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
WORKER_NUMBERS: Final = 10_000  # a worker's number is below this (the log route's path says so too)
WorkerNumber = Annotated[int, Field(ge=0, lt=WORKER_NUMBERS)]
# What the store's columns hold: an exit code is a 32-bit integer, a byte count or offset a 64-bit one.
# Past these the store refuses the number (written or asked for), which must be a 422 at the door, not a
# 500 at the commit or the query. The API's integer query parameters are bounded by the same ends.
INT32_END: Final = 2**31
INT64_END: Final = 2**63
ExitCode = Annotated[int, Field(ge=-INT32_END, lt=INT32_END)]
ByteCount = Annotated[int, Field(ge=0, lt=INT64_END)]
EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")]

# Each account's containers run in user namespaces that map their uids and gids 0..USERNS_SIZE-1 onto the
# account's own host range, the same on every node: range N starts at USERNS_FIRST + N * USERNS_SIZE,
# above every uid a host's own users and services get, and below 2**32 - 1 (the kernel's invalid id).
USERNS_FIRST: Final = 2**30
USERNS_SIZE: Final = 65536
USERNS_SLOTS: Final = (2**32 - 1 - USERNS_FIRST) // USERNS_SIZE  # accounts a fleet can hold


class RegistryAuth(ControlPlaneMessage):
    """The credentials a worker's image is pulled with: a registry key of its job's project. A secret:
    sent only with an assignment that needs its secrets, used for the pull, never put in the container."""

    registry: RegistryHost
    username: str = Field(min_length=1, max_length=256)
    password: str = Field(min_length=1, max_length=8192)


class UserNamespace(ControlPlaneMessage):
    """The host range a worker's container maps its uids and gids 0..size-1 onto (docs/minion-jobs.md)."""

    first: int = Field(ge=USERNS_FIRST, le=USERNS_FIRST + (USERNS_SLOTS - 1) * USERNS_SIZE)
    size: int = Field(USERNS_SIZE, ge=1024, le=USERNS_SIZE)

    @classmethod
    def of_slot(cls, slot: int) -> UserNamespace:
        return cls(first=USERNS_FIRST + slot * USERNS_SIZE)


class MountSource(StrEnum):
    DATASTORE = "datastore"  # a regional datastore; `path` is below the datastore's root
    CACHE = "cache"  # the region cache on the node (/data/cache or /scratch); `path` is below it
    OBJECT = "object"  # a dataset, model or checkpoint the node fetches by digest (contracts/data_objects.py)


class WorkerRunState(StrEnum):
    """What the minion observes of one worker's container."""

    STARTING = "starting"  # being prepared (mounts, image check) or created, not yet running
    RUNNING = "running"
    EXITED = "exited"  # ended by itself; exit_code says how
    STOPPED = "stopped"  # ended because the desired state said stop (exit_code is what SIGTERM/KILL left)
    FAILED_TO_START = "failed_to_start"  # never ran; message says why (bad image, mount refused, no GPU)


ENDED: Final = frozenset({WorkerRunState.EXITED, WorkerRunState.STOPPED, WorkerRunState.FAILED_TO_START})


class Mount(ControlPlaneMessage):
    """One bind mount into a worker's container."""

    source_kind: MountSource
    datastore: str | None = Field(None, min_length=1, max_length=128)  # the datastore's name (datastore only)
    object_id: str | None = Field(None, min_length=1, max_length=32)  # an object mount's object
    digest: str | None = Field(None, pattern=r"^sha256:[0-9a-f]{64}$")  # …and its manifest's digest
    name: str | None = Field(None, max_length=128)  # …and its name, for the worker's messages
    path: str = Field("/", max_length=MAX_PATH)  # below the datastore root / the cache; `/` = the root
    target: str = Field(max_length=MAX_PATH)  # absolute path in the container, e.g. /opt/ml/output
    read_only: bool = False

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        try:  # NUL, `..` and over-long paths are refused with how to write them
            requested_parts(value)
        except InvalidInput as exc:  # pydantic reports only ValueErrors as validation errors
            raise ValueError(str(exc)) from None
        return value

    @field_validator("target")
    @classmethod
    def _target(cls, value: str) -> str:
        path = PurePosixPath(value)
        if not path.is_absolute() or ".." in path.parts or "\0" in value or not value.isprintable():
            raise ValueError(f"mount target {value!r} must be an absolute container path without '..'")
        if path == PurePosixPath("/"):
            raise ValueError("a mount target cannot be the container's root; use e.g. /opt/ml/output")
        return value

    @model_serializer(mode="wrap")
    def _without_unused(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """An object mount's three fields only on an object mount: every other mount travels as before."""
        data: dict[str, Any] = handler(self)
        for name in ("object_id", "digest", "name"):
            if data.get(name) is None:
                data.pop(name, None)
        return data

    @model_validator(mode="after")
    def _datastore_named(self) -> Mount:
        if (self.source_kind is MountSource.DATASTORE) != (self.datastore is not None):
            raise ValueError("`datastore` names the datastore of a datastore mount, and only of one")
        named = self.object_id is not None and self.digest is not None
        if (self.source_kind is MountSource.OBJECT) != named:
            raise ValueError("`object_id` and `digest` name the object of an object mount, and only of one")
        return self


class DatastoreAccess(ControlPlaneMessage):
    """How the node mounts a datastore root that a mount names (the same fields as `provision datastore
    add`; the password only for SMB). Sent only for datastores that this node's workers mount."""

    name: str = Field(min_length=1, max_length=128)
    type: DatastoreType
    address: str = Field(min_length=1, max_length=255)
    root: str = Field(min_length=1, max_length=MAX_PATH)
    username: str | None = Field(None, max_length=256)
    password: str | None = Field(None, max_length=1024, repr=False)

    @model_validator(mode="after")
    def _rules(self) -> DatastoreAccess:
        try:
            check_datastore(self.name, self.type, self.root, self.username, self.password)
        except InvalidInput as exc:
            raise ValueError(str(exc)) from None
        return self


class ReservationBinding(ControlPlaneMessage):
    """The regional port reservation a worker serves: the node publishes `port` (host port = container
    port) while the worker runs, and answers for `hostname`.local over mDNS."""

    port: int = Field(ge=1, le=65535)
    hostname: str = Field(pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
    protocol: Protocol = Protocol.TCP


class ServeBinding(ControlPlaneMessage):
    """The server a notebook or endpoint worker runs (docs/job-urls.md): the minion reports the worker
    running only once GET `health_path` on `port` answers below 500, and its tunnel reaches that port."""

    port: int = Field(ge=1, le=65535)
    health_path: str = Field("/", max_length=512, pattern=r"^/[^\s]*$")
    # Jupyter's /api/status under this path (a notebook: its activity and open connections); None for an
    # endpoint, whose activity is the connections the tunnel carries to it
    status_path: str | None = Field(None, max_length=512, pattern=r"^/[^\s]*$")


class Peer(ControlPlaneMessage):
    """Where another worker of the same job listens: its node's address in the region and its port."""

    address: str = Field(min_length=1, max_length=255, pattern=r"^[A-Za-z0-9.:_-]+$")
    port: int = Field(ge=1, le=65535)


class WorkerAssignment(ControlPlaneMessage):
    """One container the node must run (or stop)."""

    job_id: JobId
    job_name: str = Field(min_length=1, max_length=63)
    worker: WorkerNumber
    generation: Generation
    image: RegistryImage
    command: str = Field(min_length=1, max_length=MAX_COMMAND)  # run with `/bin/sh -c` in the container
    env: dict[EnvName, Annotated[str, Field(max_length=MAX_ENV_VALUE)]] = Field(
        default_factory=dict, max_length=MAX_ASSIGNMENT_ENV
    )
    gpu_count: int = Field(0, ge=0, le=64)  # the minion picks which GPUs; two workers never share one
    cpus: float = Field(gt=0, le=4096)
    memory_mb: int = Field(ge=16, le=64 * 2**20)
    disk_gb: int = Field(0, ge=0, le=100_000)  # 0: no quota
    mounts: list[Mount] = Field(default_factory=list, max_length=MAX_MOUNTS)
    reservation: ReservationBinding | None = None
    serve: ServeBinding | None = None  # a notebook's or endpoint's server, reached through the tunnel
    # the port its peers reach it on, published on the node (host port = container port), and where each
    # peer listens: a customer's job may reach exactly these over the LAN (minion/jobs/network.py)
    port: int | None = Field(None, ge=1024, le=65535)
    peers: list[Peer] = Field(default_factory=list, max_length=MAX_PEERS)
    # host devices passed through as they are (`--device`): a Jetson's accelerator by CDI name and its
    # video/media devices (the device inference container, contracts/device.py); jobs leave it empty
    devices: list[Annotated[str, Field(pattern=r"^[^\s]{1,256}$")]] = Field(
        default_factory=list, max_length=64
    )
    # a customer's job: the container's root is its account's host range, never the node's root. None:
    # the node's own container (a device's inference), run as the node's root
    userns: UserNamespace | None = None
    # the job's own registry credentials for its image; None: an anonymous pull (never the node's own)
    registry_auth: RegistryAuth | None = None
    stop: bool = False
    stop_grace_s: int = Field(30, ge=0, le=3600)  # SIGTERM, then this long, then SIGKILL

    @model_validator(mode="after")
    def _distinct_targets(self) -> WorkerAssignment:
        targets = [PurePosixPath(m.target) for m in self.mounts]
        if len(set(targets)) != len(targets):
            raise ValueError("two mounts share a target; give each its own container path")
        return self

    @property
    def key(self) -> tuple[str, int]:
        return (self.job_id, self.worker)


class JobNetwork(ControlPlaneMessage):
    """What a customer's job may reach past the internet (minion/jobs/network.py): its region's policy."""

    lan: bool = False  # the private address ranges (datastores, peers, the LAN); never the node itself


class JobsDesired(ControlPlaneMessage):
    """desired["jobs"]: every worker this node must run, how to reach the datastores they mount, and the
    network its jobs get."""

    workers: list[WorkerAssignment] = Field(default_factory=list, max_length=MAX_WORKERS_PER_NODE)
    datastores: list[DatastoreAccess] = Field(default_factory=list, max_length=64)
    network: JobNetwork = Field(default_factory=JobNetwork)

    @model_validator(mode="after")
    def _unique(self) -> JobsDesired:
        keys = [w.key for w in self.workers]
        if len(set(keys)) != len(keys):
            raise ValueError("a (job_id, worker) pair is listed twice")
        return self


USAGE_SAMPLE_S: Final = 10.0  # how often the minion samples a running worker's container
USAGE_PER_REPORT: Final = 3  # a report's samples at most: the last 30 s (a lost beat loses nothing)
USAGE_REPORT_BUDGET: Final = 48  # samples in one JobsActual at most: a node of 64 workers sends 1 each


class GpuUsage(MinionMessage):
    """One GPU of a worker at one sample (NVML)."""

    index: int = Field(ge=0, le=63)
    util_pct: float = Field(ge=0, le=100)
    memory_bytes: ByteCount
    power_w: float = Field(ge=0, le=10_000)
    temp_c: float = Field(ge=-50, le=200)


class WorkerUsage(MinionMessage):
    """What a worker's container used at one sample (minion/jobs/usage.py): CPU over the interval since
    the sample before, memory and disk now, network counters since the container started."""

    at: float = Field(ge=0, lt=2**40, description="Unix time of the sample, in seconds")
    cpu_cores: float = Field(ge=0, le=4096)  # CPU time per wall time since the previous sample
    memory_bytes: ByteCount
    disk_bytes: ByteCount  # its container disk (the writable layer) and own output, against disk_gb
    net_rx_bytes: ByteCount
    net_tx_bytes: ByteCount
    gpus: list[GpuUsage] = Field(default_factory=list, max_length=64)


class WorkerReport(MinionMessage):
    """What the node observes of one worker."""

    job_id: JobId
    worker: WorkerNumber
    generation: Generation
    state: WorkerRunState
    exit_code: ExitCode | None = None
    message: str | None = Field(None, max_length=MESSAGE_MAX)
    gpu_indices: list[int] = Field(default_factory=list, max_length=64)
    log_acked: ByteCount = 0  # bytes of output the control plane has acknowledged
    log_eof: bool = False  # the whole output was acked (the container ended)
    # its latest usage samples, oldest first (the control plane keeps those newer than what it holds)
    usage: list[WorkerUsage] = Field(default_factory=list, max_length=USAGE_PER_REPORT)
    # how long its container ran, from podman's start and finish times: reported once it ended, so a worker
    # that began and ended between two beats is billed for the time it ran (services/jobs)
    ran_s: float | None = Field(None, ge=0, le=2**40)
    # a notebook's or endpoint's server (ServeBinding): seconds since its last activity (a notebook: with no
    # connection open, since Jupyter's last kernel or API activity; an endpoint: since its last connection
    # through the tunnel), for the job's autostop
    idle_s: float | None = Field(None, ge=0, le=2**40)


# What a node tells of its images (NodeImages): enough for the dry run, bounded for the heartbeat
MAX_LOCAL_IMAGES: Final = 64
MAX_REGISTRIES: Final = 16


class RegistryPull(MinionMessage):
    """How the node's last pull from one registry went: its time and, when it failed, podman's error."""

    ok: bool
    at: datetime
    message: str | None = Field(None, max_length=MESSAGE_MAX)


class NodeImages(MinionMessage):
    """What a job's image will meet on this node: the `localhost/` images it holds (such an image is the
    node's own and never pulled, so a node without it cannot start the job), and how its last pull from
    each registry went (every other image is pulled at each start). `job create --dry-run` warns from
    these (services/jobs/image_warnings.py)."""

    local: list[RegistryImage] = Field(default_factory=list, max_length=MAX_LOCAL_IMAGES)
    pulls: dict[RegistryHost, RegistryPull] = Field(default_factory=dict, max_length=MAX_REGISTRIES)


class JobsActual(MinionMessage):
    """actual["jobs"] in a heartbeat."""

    workers: list[WorkerReport] = Field(default_factory=list, max_length=MAX_WORKERS_PER_NODE)
    message: str | None = Field(None, max_length=MESSAGE_MAX)  # e.g. "podman is not installed"
    images: NodeImages | None = None  # None: a minion that does not tell


class LogChunk(MinionMessage):
    """POST LOG_ROUTE body (node credential)."""

    offset: ByteCount
    data: str = Field(max_length=LOG_CHUNK_MAX)
    eof: bool = False
    # the attempt whose output this is: offsets start at 0 again for a new generation of the worker
    generation: Generation | None = None

    @field_validator("data")
    @classmethod
    def _bounded(cls, value: str) -> str:
        if len(value.encode()) > LOG_CHUNK_MAX:
            raise ValueError(f"a log chunk carries at most {LOG_CHUNK_MAX} bytes of utf-8")
        return value


class LogAck(ControlPlaneMessage):
    """The answer to a LogChunk: bytes held contiguously from offset 0 (may be below the chunk's end when
    an earlier chunk is missing: the minion then resends from `acked`)."""

    acked: int = Field(ge=0)
    eof: bool = False  # the control plane holds the whole output
