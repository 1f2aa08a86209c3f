"""The minion's settings: every `RIGBASE_*` variable it reads, read once per `minion` command.

minion/cli.py's callback loads `MinionSettings.from_env()` into the command's context and each command
passes what it needs down (state directory, GPU catalogue, LAN address); no other module reads the
environment. `--bundle`, `--join-token` and `--tcti` take their defaults from RIGBASE_BUNDLE,
RIGBASE_JOIN_TOKEN and RIGBASE_TCTI through the CLI framework's own `envvar=` (shown in `--help`).
Standard library only: the minion ships onto nodes with pinned wheels. The table: docs/join-protocol.md,
"Settings"."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

from contracts.jobs import USAGE_SAMPLE_S

_T = TypeVar("_T")

BUNDLE_ENV = "RIGBASE_BUNDLE"
JOIN_TOKEN_ENV = "RIGBASE_JOIN_TOKEN"
TCTI_ENV = "RIGBASE_TCTI"
DEVICE_KEY_ENV = "RIGBASE_DEVICE_KEY"  # "1": a device without a TPM joins with its device key
STATE_DIR_ENV = "RIGBASE_STATE_DIR"
GPU_CATALOGUE_ENV = "RIGBASE_GPU_CATALOGUE"
LAN_ADDRESS_ENV = "RIGBASE_LAN_ADDRESS"
ANSIBLE_COLLECTIONS_ENV = "RIGBASE_ANSIBLE_COLLECTIONS"
EVENT_LOG_ENV = "RIGBASE_EVENT_LOG"
# google-auth's name for it: where a GCE VM's metadata server is (tests point it at a local one)
GCE_METADATA_HOST_ENV = "GCE_METADATA_HOST"
# Job containers (minion/jobs/, docs/minion-jobs.md): unset means podman's own default
JOBS_PODMAN_ENV = "RIGBASE_JOBS_PODMAN"
JOBS_OCI_RUNTIME_ENV = "RIGBASE_JOBS_OCI_RUNTIME"
JOBS_CGROUP_MANAGER_ENV = "RIGBASE_JOBS_CGROUP_MANAGER"
JOBS_ULIMITS_ENV = "RIGBASE_JOBS_ULIMITS"
JOBS_NETWORK_ENV = "RIGBASE_JOBS_NETWORK"
JOBS_OWN_NETWORK_ENV = "RIGBASE_JOBS_OWN_NETWORK"
JOBS_SUBNET_ENV = "RIGBASE_JOBS_SUBNET"
JOBS_CDI_SPEC_DIRS_ENV = "RIGBASE_JOBS_CDI_SPEC_DIRS"
JOBS_GPU_KIND_ENV = "RIGBASE_JOBS_GPU_KIND"
JOBS_DISK_QUOTA_ENV = "RIGBASE_JOBS_DISK_QUOTA"
JOBS_CACHE_DIR_ENV = "RIGBASE_JOBS_CACHE_DIR"
JOBS_DATASTORE_DIR_ENV = "RIGBASE_JOBS_DATASTORE_DIR"
JOBS_OBJECT_DIR_ENV = "RIGBASE_JOBS_OBJECT_DIR"
JOBS_OBJECT_CACHE_GB_ENV = "RIGBASE_JOBS_OBJECT_CACHE_GB"
JOBS_PODMAN_ROOT_ENV = "RIGBASE_JOBS_PODMAN_ROOT"
JOBS_PODMAN_RUNROOT_ENV = "RIGBASE_JOBS_PODMAN_RUNROOT"

DEFAULT_STATE_DIR = Path("/var/lib/rigbase/minion")
# Where community.general (the chroot connection, parted, filesystem) is looked for, first hit wins: the
# venv's, unpacked by scripts/install-deps.sh (a development checkout, the lab), then the boot image's.
ANSIBLE_COLLECTIONS_SEARCH = (
    Path(sys.prefix) / "ansible-collections",
    Path("/usr/lib/rigbase/ansible-collections"),
)
# The firmware's TCG event log as the kernel exposes it; sent with every quote (docs/join-protocol.md,
# "Boot path (PCR 4)"). Absent on machines without a firmware TPM log (the lab's swtpm nodes).
DEFAULT_EVENT_LOG = Path("/sys/kernel/security/tpm0/binary_bios_measurements")
# Where the NVIDIA Container Toolkit (`nvidia-ctk cdi generate`) writes its spec: podman's own defaults
DEFAULT_CDI_SPEC_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))
DISK_QUOTA_MODES = ("watch", "storage-opt", "off")  # docs/minion-jobs.md, "Disk quota"


@dataclass(frozen=True)
class ContainerSettings:
    """How the minion runs job containers. The defaults are podman's own, right for a node with systemd
    and unified cgroups; a machine without them (cgroups v1, no CAP_SYS_RESOURCE) sets e.g.
    RIGBASE_JOBS_OCI_RUNTIME=runc RIGBASE_JOBS_CGROUP_MANAGER=cgroupfs
    RIGBASE_JOBS_ULIMITS=nofile=1024:1024,nproc=4096:4096."""

    podman: str = "podman"
    oci_runtime: str | None = None  # --runtime
    cgroup_manager: str | None = None  # --cgroup-manager
    ulimits: tuple[str, ...] = ()  # --ulimit each, e.g. ("nofile=1024:1024",); () = podman's defaults
    # --network for every container, e.g. ns:/run/netns/NAME (a lab node's namespace). None: customers'
    # jobs run on the minion's own network, narrowed (minion/jobs/network.py), the node's own on podman's
    network: str | None = None
    jobs_network: str = "rigbase-jobs"
    jobs_subnet: str = "10.89.0.0/24"
    # read to find the GPUs; passed to podman as --cdi-spec-dir only when set explicitly (podman >= 4.7)
    cdi_spec_dirs: tuple[Path, ...] = DEFAULT_CDI_SPEC_DIRS
    cdi_spec_dirs_explicit: bool = False
    gpu_kind: str = "nvidia.com/gpu"  # the CDI kind whose devices are the node's GPUs
    disk_quota: str = "watch"  # one of DISK_QUOTA_MODES
    cache_dir: Path = Path("/data/cache")  # the region cache that `cache` mounts are below
    datastore_dir: Path = Path("/run/rigbase/datastores")  # where datastore roots are mounted, one per name
    object_dir: Path | None = None  # the node's object cache (minion/jobs/objects.py); else CACHE/objects
    object_cache_gb: float | None = None  # its budget; None: its volume's size less a reserve
    podman_root: Path | None = None  # --root (a separate image/container store; the lab, tests)
    podman_runroot: Path | None = None  # --runroot
    usage_sample_s: float = USAGE_SAMPLE_S  # how often a running worker's usage is sampled

    def __post_init__(self) -> None:
        if self.disk_quota not in DISK_QUOTA_MODES:
            raise ValueError(
                f"{JOBS_DISK_QUOTA_ENV}={self.disk_quota!r}: use one of {', '.join(DISK_QUOTA_MODES)}"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> ContainerSettings:
        def path(name: str) -> Path | None:
            return Path(value) if (value := environ.get(name)) else None

        cdi = environ.get(JOBS_CDI_SPEC_DIRS_ENV)
        ulimits = environ.get(JOBS_ULIMITS_ENV)
        return cls(
            podman=environ.get(JOBS_PODMAN_ENV) or "podman",
            oci_runtime=environ.get(JOBS_OCI_RUNTIME_ENV) or None,
            cgroup_manager=environ.get(JOBS_CGROUP_MANAGER_ENV) or None,
            ulimits=tuple(u.strip() for u in ulimits.split(",") if u.strip()) if ulimits else (),
            network=environ.get(JOBS_NETWORK_ENV) or None,
            jobs_network=environ.get(JOBS_OWN_NETWORK_ENV) or "rigbase-jobs",
            jobs_subnet=environ.get(JOBS_SUBNET_ENV) or "10.89.0.0/24",
            cdi_spec_dirs=tuple(Path(d) for d in cdi.split(":") if d) if cdi else DEFAULT_CDI_SPEC_DIRS,
            cdi_spec_dirs_explicit=bool(cdi),
            gpu_kind=environ.get(JOBS_GPU_KIND_ENV) or "nvidia.com/gpu",
            disk_quota=environ.get(JOBS_DISK_QUOTA_ENV) or "watch",
            cache_dir=path(JOBS_CACHE_DIR_ENV) or Path("/data/cache"),
            datastore_dir=path(JOBS_DATASTORE_DIR_ENV) or Path("/run/rigbase/datastores"),
            object_dir=path(JOBS_OBJECT_DIR_ENV),
            object_cache_gb=_gb(environ.get(JOBS_OBJECT_CACHE_GB_ENV)),
            podman_root=path(JOBS_PODMAN_ROOT_ENV),
            podman_runroot=path(JOBS_PODMAN_RUNROOT_ENV),
        )


def _gb(value: str | None) -> float | None:
    if not value:
        return None
    try:
        gb = float(value)
    except ValueError:
        gb = -1.0
    if gb <= 0:
        raise ValueError(f"{JOBS_OBJECT_CACHE_GB_ENV}={value!r}: give the cache's budget in GB, e.g. 500")
    return gb


class CommandContext(Protocol):
    """The part of a Typer/Click context `MinionSettings.of` uses (no CLI import here)."""

    def find_object(self, object_type: type[_T]) -> _T | None: ...


@dataclass(frozen=True)
class MinionSettings:
    """What the environment decides for one `minion` command; the defaults are a node's."""

    # ak.json, node.json, status.json (minion/join/state.py); `--state-dir` wins
    state_dir: Path = DEFAULT_STATE_DIR
    # the GPU catalogue file; None: the source tree's, then the installed one (minion/hardware/catalogue.py)
    gpu_catalogue: Path | None = None
    # the address mDNS answers from; None: the one the kernel routes mDNS multicast out of
    lan_address: str | None = None
    # the TCG event log sent with each quote; a missing or unreadable file means none is sent
    event_log: Path = DEFAULT_EVENT_LOG
    # the Ansible collections finalize runs with (minion/finalize/runner.py); None: ANSIBLE_COLLECTIONS_SEARCH
    ansible_collections: Path | None = None
    # the GCE metadata server `minion gce-bundle` reads (minion/gce_metadata.py)
    gce_metadata_host: str = "metadata.google.internal"
    # job containers (minion/jobs/): runtime, cgroup manager, ulimits, network, CDI, quota, data roots
    jobs: ContainerSettings = field(default_factory=ContainerSettings)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> MinionSettings:
        """Unset and empty variables both mean the default."""
        state_dir = environ.get(STATE_DIR_ENV)
        catalogue = environ.get(GPU_CATALOGUE_ENV)
        event_log = environ.get(EVENT_LOG_ENV)
        return cls(
            state_dir=Path(state_dir) if state_dir else DEFAULT_STATE_DIR,
            gpu_catalogue=Path(catalogue) if catalogue else None,
            lan_address=environ.get(LAN_ADDRESS_ENV) or None,
            event_log=Path(event_log) if event_log else DEFAULT_EVENT_LOG,
            ansible_collections=Path(coll) if (coll := environ.get(ANSIBLE_COLLECTIONS_ENV)) else None,
            gce_metadata_host=environ.get(GCE_METADATA_HOST_ENV) or cls.gce_metadata_host,
            jobs=ContainerSettings.from_env(environ),
        )

    @classmethod
    def of(cls, ctx: CommandContext) -> MinionSettings:
        """The settings the `minion` callback loaded for this command. A bare Typer app that registers
        a command module without that callback (tests) gets them from the environment here, once."""
        found = ctx.find_object(cls)
        return found if found is not None else cls.from_env()
