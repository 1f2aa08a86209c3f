"""One WorkerAssignment → the `podman run` arguments that start its container.

What the container gets (docs/minion-jobs.md): the image with the command run by `/bin/sh -c` under
podman's `--init` (so SIGTERM reaches the command, which PID 1 would ignore), the job's environment plus
RIGBASE_JOB_NAME, RIGBASE_JOB_ID, RIGBASE_WORKER and RIGBASE_OUTPUT_PATH (these win over the job's own),
written to a 0600 env file rather than the command line (values may be secrets; argv is world-readable in
/proc), --cpus and --memory, the disk quota where podman can enforce it, the runtime settings (ulimits,
network), its GPUs by CDI name, its data mounts, the reservation's port published, and the labels that let
a restarted minion adopt it."""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass
from pathlib import Path

from contracts.jobs import INPUT_PATH, OUTPUT_PATH, WorkerAssignment
from minion.jobs.mounts import Bound
from minion.jobs.podman import LABEL_GENERATION, LABEL_GPUS, LABEL_JOB, LABEL_OWNER, LABEL_WORKER
from minion.settings import ContainerSettings


class EnvRefused(Exception):
    """An environment value podman's env file cannot carry."""


# Toward Kubernetes' Pod Security "restricted" level (docs/minion-jobs.md, "What a job can reach"): every
# capability dropped but those a package install (apt, pip) needs as the container's root, no privilege
# gained through setuid binaries, and podman's default seccomp profile (never turned off here).
KEPT_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "SETUID", "SETGID", "KILL")
HARDENING = (
    "--cap-drop=all",
    f"--cap-add={','.join(KEPT_CAPABILITIES)}",
    "--security-opt=no-new-privileges",
)


def is_customers(a: WorkerAssignment) -> bool:
    """A customer's job (the control plane gives it its account's user namespace), not a container of the
    node's own (a device's inference)."""
    return a.userns is not None


def pull_policy(a: WorkerAssignment, auth_file: Path) -> list[str]:
    """A registry image is pulled on every start (only its manifest when the layers are here), so the
    registry decides whether this job may have it: another tenant's private image cached on the node is
    not a way in. A customer's job pulls with its own credentials only (`--authfile`, its project's
    registry key or none: an anonymous pull, never the node's own login); the node's own container with
    the node's. A `localhost/` image is the node's own (never in a registry) and runs as it is; a node
    that cannot reach the image's registry cannot start it."""
    if a.image.startswith("localhost/"):
        return []
    return ["--pull=always", "--authfile", str(auth_file)] if is_customers(a) else ["--pull=always"]


def auth_document(a: WorkerAssignment) -> str:
    """containers-auth.json(5) with the job's registry key, or with none."""
    auths: dict[str, dict[str, str]] = {}
    if (key := a.registry_auth) is not None:
        auths[key.registry] = {"auth": base64.b64encode(f"{key.username}:{key.password}".encode()).decode()}
    return json.dumps({"auths": auths})


def user_namespace(a: WorkerAssignment) -> list[str]:
    """A customer's container in its own user namespace: its uids and gids 0..size-1 are its account's
    host range (contracts.jobs.UserNamespace), so its root is no uid the node or another account has.
    Rootful podman maps it itself (no /etc/subuid entry needed) and gives the image's files that range."""
    if a.userns is None:
        return []
    mapping = f"0:{a.userns.first}:{a.userns.size}"
    return [f"--uidmap={mapping}", f"--gidmap={mapping}"]


def container_name(owner: str, job_id: str, worker: int) -> str:
    return f"rigbase-{owner}-{job_id}-{worker}"


def environment(a: WorkerAssignment, gpus: list[int]) -> dict[str, str]:
    env = dict(a.env)
    env.update(
        RIGBASE_JOB_NAME=a.job_name,
        RIGBASE_JOB_ID=a.job_id,
        RIGBASE_WORKER=str(a.worker),
        RIGBASE_OUTPUT_PATH=OUTPUT_PATH,
        RIGBASE_INPUT_PATH=INPUT_PATH,
        RIGBASE_GPU_INDICES=",".join(str(g) for g in gpus),
    )
    return env


def write_env_file(path: Path, env: dict[str, str]) -> None:
    """KEY=VALUE lines, created 0600 from the start (no chmod window)."""
    bad = sorted(k for k, v in env.items() if "\n" in v or "\r" in v or "\0" in v)
    if bad:
        raise EnvRefused(f"environment variable(s) {', '.join(bad)} contain a line break; use one line each")
    write_private(path, "".join(f"{k}={v}\n" for k, v in env.items()))


def write_private(path: Path, text: str) -> None:
    """A file only the node's root reads, created 0600 from the start (no chmod window)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)


def network_of(settings: ContainerSettings, a: WorkerAssignment) -> str | None:
    """The configured network for every container; else a customer's job (one with a user namespace) on
    the minion's narrowed jobs network (minion/jobs/network.py), the node's own container on podman's."""
    if settings.network:
        return settings.network
    return settings.jobs_network if is_customers(a) else None


def publishes_ports(settings: ContainerSettings) -> bool:
    """A container that joins an existing namespace (ns:…, host) already listens on the node's
    addresses; podman publishes ports only for a network of its own."""
    network = settings.network or ""
    return not (network.startswith("ns:") or network in ("host", "none"))


@dataclass(frozen=True)
class RunPlan:
    name: str
    owner: str
    assignment: WorkerAssignment
    gpus: list[int]
    bound: list[Bound]
    log_path: Path
    env_file: Path
    auth_file: Path  # the customer's job's registry credentials (auth_document), beside the env file

    def args(self, settings: ContainerSettings) -> list[str]:
        a = self.assignment
        labels = {
            LABEL_OWNER: self.owner,
            LABEL_JOB: a.job_id,
            LABEL_WORKER: str(a.worker),
            LABEL_GENERATION: a.generation,
            LABEL_GPUS: ",".join(str(g) for g in self.gpus),
        }
        args = [
            "run",
            "--detach",
            "--init",
            "--name",
            self.name,
            *HARDENING,
            *user_namespace(a),
            *pull_policy(a, self.auth_file),
        ]
        for key, value in labels.items():
            args += ["--label", f"{key}={value}"]
        args += ["--log-driver", "k8s-file", "--log-opt", f"path={self.log_path}"]
        args += ["--cpus", f"{a.cpus:g}", "--memory", f"{a.memory_mb}m", "--env-file", str(self.env_file)]
        for ulimit in settings.ulimits:
            args += ["--ulimit", ulimit]
        if network := network_of(settings, a):
            args += ["--network", network]
        if a.disk_gb and settings.disk_quota == "storage-opt":
            args += ["--storage-opt", f"size={a.disk_gb}G"]
        if a.reservation is not None and publishes_ports(settings):
            port = a.reservation.port
            args += ["--publish", f"{port}:{port}/{a.reservation.protocol.value}"]
        if a.port is not None and publishes_ports(settings):  # where its gang's peers reach it
            args += ["--publish", f"{a.port}:{a.port}/tcp"]
        for index in self.gpus:
            args += ["--device", f"{settings.gpu_kind}={index}"]
        for device in a.devices:
            args += ["--device", device]
        for bound in self.bound:
            args += ["--volume", bound.volume()]
        # `--` ends podman's options: nothing after it (the image, the command) is read as one
        return [*args, "--entrypoint", "/bin/sh", "--", a.image, "-c", a.command]
