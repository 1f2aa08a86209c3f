"""How a lab node's minion runs job containers: its RIGBASE_JOBS_* environment and its fake GPUs.

The minion reads its container settings from its environment (docs/minion-jobs.md, "Settings"); this
module decides them for each lab node:

- **Runtime workarounds from what this machine lacks**, never hard-coded: a machine with systemd and
  unified cgroups v2 and CAP_SYS_RESOURCE gets podman's defaults; each missing fact adds the setting
  WORKAROUNDS names (hybrid cgroups v1 → runc and cgroupfs; no systemd → cgroupfs; no CAP_SYS_RESOURCE →
  lowered ulimits, the only kind it may set). A RIGBASE_JOBS_* variable in `provision lab up`'s own
  environment wins over what is detected.
- **Network `host`.** The minion runs in its node's network namespace (entered with `nsenter --net`
  only, see lifecycle._start_minion: `ip netns exec` would remount /sys and hide the cgroup mounts from
  podman), so the node's "host" network *is* the namespace. `--network ns:/run/netns/NAME` for the
  namespace podman already runs in is refused by runc ("sysctl net.ipv4.ping_group_range not allowed in
  host network namespace": podman adds that sysctl to every non-host network).
- **Per-node directories**: the region cache (`cache` mounts) and where datastore roots are mounted.
- **GPUs through CDI.** Each node gets a CDI spec of its own kind (`rigbase-lab-node1.lab.rigbase.dev/gpu`)
  in /var/run/cdi (podman 4.3 reads only /etc/cdi and /var/run/cdi; /var/run is a tmpfs, gone after a
  reboot like the namespaces) with one device per GPU of the hardware profile, named by index as
  `nvidia-ctk cdi generate` names them. There is no GPU here: each device is /dev/null bound at
  /dev/nvidiaN in the container (a bind mount, not a device node: a job's container has its own user
  namespace, where runc binds a device from the host path of the same name, and the host has no
  /dev/nvidiaN). `lab down` removes the specs.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

# the minion's variables (minion/settings.py; the provisioner does not import the minion)
PODMAN = "RIGBASE_JOBS_PODMAN"
OCI_RUNTIME = "RIGBASE_JOBS_OCI_RUNTIME"
CGROUP_MANAGER = "RIGBASE_JOBS_CGROUP_MANAGER"
ULIMITS = "RIGBASE_JOBS_ULIMITS"
NETWORK = "RIGBASE_JOBS_NETWORK"
GPU_KIND = "RIGBASE_JOBS_GPU_KIND"
DISK_QUOTA = "RIGBASE_JOBS_DISK_QUOTA"
CACHE_DIR = "RIGBASE_JOBS_CACHE_DIR"
DATASTORE_DIR = "RIGBASE_JOBS_DATASTORE_DIR"
OBJECT_DIR = "RIGBASE_JOBS_OBJECT_DIR"
OBJECTS_UNDER = Path("cache") / "objects"  # a node's object cache, under its directory
# what an operator may set for the lab's minions in `provision lab up`'s environment (the rest is per node)
OPERATOR_SETTINGS = (PODMAN, OCI_RUNTIME, CGROUP_MANAGER, ULIMITS, DISK_QUOTA)

CDI_DIR = Path("/var/run/cdi")
CDI_VERSION = "0.5.0"
CDI_PREFIX = "rigbase-lab-"  # spec files rigbase-lab-nodeK.json: only the lab's own are removed
OWNER_LABEL = "rigbase.owner"  # the label the minion puts on its containers (minion/jobs/podman.py)
CAP_SYS_RESOURCE = 24
PODMAN_TIMEOUT_S = 60


@dataclass(frozen=True)
class HostFacts:
    """What decides whether podman's defaults work on this machine."""

    unified_cgroups: bool  # cgroups v2 only (crun needs it; hybrid v1 needs runc)
    systemd: bool  # systemd is PID 1 (podman's default cgroup manager talks to it)
    cap_sys_resource: bool  # may raise rlimits (podman's default ulimits raise nofile and nproc)

    @classmethod
    def read(cls) -> HostFacts:
        return cls(
            unified_cgroups=Path("/sys/fs/cgroup/cgroup.controllers").exists(),
            systemd=Path("/run/systemd/system").is_dir(),
            cap_sys_resource=_has_capability(CAP_SYS_RESOURCE),
        )


# (the fact this machine lacks, the settings that work without it, why) — checked in order, first wins
WORKAROUNDS: tuple[tuple[str, dict[str, str], str], ...] = (
    ("unified_cgroups", {OCI_RUNTIME: "runc"}, "crun refuses hybrid cgroups v1"),
    ("unified_cgroups", {CGROUP_MANAGER: "cgroupfs"}, "no unified cgroup hierarchy for systemd to manage"),
    ("systemd", {CGROUP_MANAGER: "cgroupfs"}, "systemd is not PID 1"),
    ("cap_sys_resource", {ULIMITS: "nofile=1024:1024,nproc=4096:4096"}, "rlimits can only be lowered"),
)


def _has_capability(bit: int) -> bool:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> bit & 1)
    return False


def runtime_settings(facts: HostFacts, environ: Mapping[str, str]) -> dict[str, str]:
    """The runtime variables for this machine: WORKAROUNDS for what it lacks, the operator's on top."""
    settings: dict[str, str] = {}
    for fact, values, _why in WORKAROUNDS:
        if not getattr(facts, fact):
            for name, value in values.items():
                settings.setdefault(name, value)
    return settings | {k: environ[k] for k in OPERATOR_SETTINGS if environ.get(k)}


def podman_argv(settings: Mapping[str, str]) -> list[str]:
    """podman with the global options the minion passes too (for the lab's own podman calls)."""
    argv = [settings.get(PODMAN) or "podman"]
    if settings.get(OCI_RUNTIME):
        argv += ["--runtime", settings[OCI_RUNTIME]]
    if settings.get(CGROUP_MANAGER):
        argv += ["--cgroup-manager", settings[CGROUP_MANAGER]]
    return argv


def gpu_kind(netns: str) -> str:
    """The CDI kind of one node's GPUs: its own, so two lab nodes never see each other's devices."""
    return f"{netns}.lab.rigbase.dev/gpu"


def cdi_spec_path(netns: str, directory: Path = CDI_DIR) -> Path:
    return directory / f"{netns}.json"


def write_cdi_spec(netns: str, gpus: int, directory: Path = CDI_DIR) -> Path:
    """The node's CDI spec: devices "0" … "N-1", each /dev/null bound at /dev/nvidiaN (no GPU here)."""
    devices = [
        {
            "name": str(index),
            "containerEdits": {
                "mounts": [
                    {"hostPath": "/dev/null", "containerPath": f"/dev/nvidia{index}", "options": ["bind"]}
                ]
            },
        }
        for index in range(gpus)
    ]
    spec = {"cdiVersion": CDI_VERSION, "kind": gpu_kind(netns), "devices": devices}
    path = cdi_spec_path(netns, directory)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(spec, indent=1) + "\n")
    tmp.replace(path)  # podman never reads half a spec
    return path


def remove_cdi_specs(directory: Path = CDI_DIR) -> list[Path]:
    """Every lab node's spec (the lab's namespaces have fixed names: one lab per machine)."""
    removed = sorted(directory.glob(f"{CDI_PREFIX}*.json")) if directory.is_dir() else []
    for path in removed:
        path.unlink(missing_ok=True)
    return removed


def minion_environment(
    *, netns: str, node_dir: Path, runtime: Mapping[str, str], gpus: int, objects: Path | None = None
) -> dict[str, str]:
    """The RIGBASE_JOBS_* variables of one node's `minion run`. `objects`: its object cache, when not its
    own (a compute node of a central region reads its storage node's)."""
    env = dict(runtime) | {
        NETWORK: "host",
        CACHE_DIR: str(node_dir / "cache"),
        DATASTORE_DIR: str(node_dir / "datastores"),
        OBJECT_DIR: str(objects or node_dir / OBJECTS_UNDER),
    }
    return env | ({GPU_KIND: gpu_kind(netns)} if gpus else {})


def owner_of(node_dir: Path) -> str | None:
    """The label the node's minion put on its containers (kept in its state directory), if any."""
    try:
        return (node_dir / "minion" / "jobs" / "owner").read_text().strip() or None
    except OSError:
        return None


def remove_containers(owner: str, runtime: Mapping[str, str]) -> list[str]:
    """Remove the containers a node's minion left (they outlive `minion run` by design). Returns ids."""
    podman = podman_argv(runtime)
    try:
        listed = subprocess.run(
            [*podman, "ps", "--all", "--quiet", "--filter", f"label={OWNER_LABEL}={owner}"],
            capture_output=True,
            text=True,
            timeout=PODMAN_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []  # no podman: the minion could not have started any
    ids = listed.stdout.split()
    if ids:
        subprocess.run(
            [*podman, "rm", "--force", "--time", "1", *ids],
            capture_output=True,
            timeout=PODMAN_TIMEOUT_S,
            check=False,
        )
    return ids


def environ_without_rigbase(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The lab's environment minus every RIGBASE_* (the minion's settings are the lab's choice)."""
    return {k: v for k, v in environ.items() if not k.startswith("RIGBASE_")}


# A Jetson's inference container asks for its GPU as `nvidia.com/gpu=all` (what `nvidia-ctk cdi generate
# --mode=csv` names on L4T; minion/devices/agent.py). podman 4.3 reads CDI specs only from /etc/cdi and
# /var/run/cdi, for every container on the machine, so the lab's stand-in is written there under the lab's
# prefix (`lab down` removes it) and only when no other spec on the machine defines that kind: a host with
# real NVIDIA GPUs keeps its own spec, and its devices are what the lab's device containers then get.
L4T_GPU_KIND = "nvidia.com/gpu"
L4T_SPEC_NAME = f"{CDI_PREFIX}l4t-gpu.json"


def write_l4t_cdi_spec(directories: tuple[Path, ...] = (Path("/etc/cdi"), CDI_DIR)) -> Path | None:
    """`nvidia.com/gpu=all` as /dev/null seen as /dev/nvhost-gpu (no GPU here); None when the machine
    already has a spec of that kind (not the lab's)."""
    ours = directories[-1] / L4T_SPEC_NAME
    for directory in directories:
        for path in sorted(directory.glob("*")) if directory.is_dir() else []:
            if path == ours or path.suffix not in (".json", ".yaml", ".yml"):
                continue
            try:
                text = path.read_text(errors="replace")
            except OSError:
                continue
            if L4T_GPU_KIND in text:
                return None
    device = {
        "name": "all",
        "containerEdits": {"deviceNodes": [{"path": "/dev/nvhost-gpu", "hostPath": "/dev/null"}]},
    }
    spec = {"cdiVersion": CDI_VERSION, "kind": L4T_GPU_KIND, "devices": [device]}
    ours.parent.mkdir(parents=True, exist_ok=True)
    tmp = ours.with_suffix(".tmp")
    tmp.write_text(json.dumps(spec, indent=1) + "\n")
    tmp.replace(ours)
    return ours
