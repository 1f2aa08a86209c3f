"""The podman command line the minion runs, and what it asks podman about its own containers.

Every call starts from `base()`: the binary plus the global options ContainerSettings gives (OCI runtime,
cgroup manager, storage roots, CDI spec dirs), none of them when unset so a real node uses podman's
defaults. Containers carry labels (LABELS) that say whose and which worker they are, so a restarted
minion finds and adopts them instead of starting duplicates."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import dataclass
from typing import Any, Final

from minion.settings import ContainerSettings

LABEL_OWNER: Final = "rigbase.owner"  # the minion (its state directory) that started the container
LABEL_JOB: Final = "rigbase.job"
LABEL_WORKER: Final = "rigbase.worker"
LABEL_GENERATION: Final = "rigbase.generation"
LABEL_GPUS: Final = "rigbase.gpus"  # "0,1": the GPU indices the worker holds (re-read at adoption)

QUERY_TIMEOUT_S: Final = 60.0  # ps/inspect/rm; `run -d` pulls nothing (no registry) but may create layers
RUN_TIMEOUT_S: Final = 300.0
KILLED_WAIT_S: Final = 5.0  # how long a call waits for a podman it killed on timeout to end
REMOVE_TRIES: Final = 3
REMOVE_RETRY_S: Final = 0.5


class PodmanError(Exception):
    """A podman command failed; the message is podman's own last error line."""


@dataclass(frozen=True)
class Container:
    """What `podman ps` says about one of our containers."""

    name: str
    state: str  # podman's: created, running, exited, stopped, paused, …
    exit_code: int | None
    labels: dict[str, str]

    @property
    def running(self) -> bool:
        return self.state in ("running", "paused", "stopping")

    @property
    def gpus(self) -> list[int]:
        return [int(g) for g in self.labels.get(LABEL_GPUS, "").split(",") if g.isdigit()]


def _last_error(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line.strip() for line in (proc.stderr or "").splitlines() if line.strip()]
    text = lines[-1] if lines else f"exit status {proc.returncode}"
    return text.removeprefix("Error: ")[:500]


@dataclass(frozen=True)
class Podman:
    settings: ContainerSettings

    def base(self) -> list[str]:
        s = self.settings
        argv = [s.podman]
        if s.oci_runtime:
            argv += ["--runtime", s.oci_runtime]
        if s.cgroup_manager:
            argv += ["--cgroup-manager", s.cgroup_manager]
        if s.podman_root:
            argv += ["--root", str(s.podman_root)]
        if s.podman_runroot:
            argv += ["--runroot", str(s.podman_runroot)]
        if s.cdi_spec_dirs_explicit:
            for directory in s.cdi_spec_dirs:
                argv += ["--cdi-spec-dir", str(directory)]
        return argv

    def missing(self) -> str | None:
        """Why no container can run here, or None."""
        if shutil.which(self.settings.podman) is None:
            return f"{self.settings.podman} is not installed on this node; install podman to run jobs"
        return None

    def call(self, args: list[str], timeout: float = QUERY_TIMEOUT_S) -> str:
        """podman ARGS; its stdout, or PodmanError with its last error line. Never blocks much past
        `timeout`: the jobs handler runs inside the heartbeat, and a beat that never ends stops the
        node's heartbeats and quotes until the watchdog restarts the minion."""
        try:
            popen = subprocess.Popen(
                [*self.base(), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        except OSError as exc:
            raise PodmanError(f"cannot run {self.settings.podman}: {exc.strerror}") from None
        try:
            stdout, stderr = popen.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            popen.kill()
            # subprocess.run waits for the killed child without a bound, and a podman stuck in the
            # kernel (slow storage after an unclean reset, seen on a TCG node) dies only when its I/O
            # ends: a node's minion sat in that wait until its watchdog aborted it, again and again.
            # Python reaps the child later, when it has died.
            try:
                popen.wait(KILLED_WAIT_S)
            except subprocess.TimeoutExpired:
                pass
            raise PodmanError(f"podman {args[0]} did not answer in {timeout:.0f} s") from None
        proc = subprocess.CompletedProcess(popen.args, popen.returncode, stdout, stderr)
        if proc.returncode != 0:
            raise PodmanError(_last_error(proc))
        return proc.stdout

    def owned(self, owner: str) -> list[Container]:
        """Every container (running or not) this minion started."""
        out = self.call(["ps", "--all", "--filter", f"label={LABEL_OWNER}={owner}", "--format", "json"])
        rows: list[dict[str, Any]] = json.loads(out or "[]") or []
        return [_container(row) for row in rows]

    def find(self, name: str) -> Container | None:
        out = self.call(["ps", "--all", "--filter", f"name=^{name}$", "--format", "json"])
        rows: list[dict[str, Any]] = json.loads(out or "[]") or []
        return _container(rows[0]) if rows else None

    def image_exists(self, image: str) -> bool:
        try:
            self.call(["image", "exists", image])
        except PodmanError:
            return False
        return True

    def wait(self, name: str) -> subprocess.Popen[str]:
        """`podman wait NAME`, running: its stdout is the exit code once the container ends."""
        return subprocess.Popen(
            [*self.base(), "wait", name], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def stop(self, name: str, grace_s: int) -> None:
        """SIGTERM, `grace_s` seconds, then SIGKILL (podman's own sequence); an ended container is fine."""
        self.call(["stop", "--ignore", "--time", str(grace_s), name], timeout=grace_s + QUERY_TIMEOUT_S)

    def remove(self, name: str) -> None:
        # podman's known EBUSY race (containers/podman#11594): the container is stopped and its shm
        # mount still settling when storage is removed; a second `rm` a moment later finishes the job.
        for attempt in range(REMOVE_TRIES):
            try:
                self.call(["rm", "--force", "--ignore", "--time", "0", name])
                return
            except PodmanError as exc:
                if "device or resource busy" not in str(exc) or attempt == REMOVE_TRIES - 1:
                    raise
                time.sleep(REMOVE_RETRY_S)

    def upper_dir(self, name: str) -> str | None:
        """The container's writable layer on the host (overlay), for the best-effort disk quota."""
        try:
            out = self.call(["inspect", "--format", "{{.GraphDriver.Data.UpperDir}}", name])
        except PodmanError:
            return None
        text = out.strip()
        return text if text.startswith("/") else None

    def ran_s(self, name: str) -> float | None:
        """How long the container `name` ran (it has ended); None when podman cannot say."""
        try:
            return ran_seconds(
                self.call(
                    [
                        "inspect",
                        "--format",
                        "{{.State.StartedAt.UnixNano}} {{.State.FinishedAt.UnixNano}}",
                        name,
                    ]
                )
            )
        except PodmanError:
            return None

    def address(self, name: str) -> str | None:
        """Where the node reaches the running container: its address on its own network; loopback for one
        that shares a namespace (ns:…, host), which listens on the node's own addresses; None when podman
        cannot say."""
        try:
            out = self.call(
                ["inspect", "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}", name]
            )
        except PodmanError:
            return None
        found = [a for a in out.split() if a and a != "<no"]
        return found[0] if found else "127.0.0.1"

    def pid_and_upper_dir(self, name: str) -> tuple[int, str | None] | None:
        """The host pid of the running container's first process and its writable layer (overlay)."""
        try:
            out = self.call(["inspect", "--format", "{{.State.Pid}} {{.GraphDriver.Data.UpperDir}}", name])
        except PodmanError:
            return None
        pid, _, upper = out.strip().partition(" ")
        if not pid.isdigit() or int(pid) <= 0:
            return None
        return int(pid), upper if upper.startswith("/") else None


def ran_seconds(inspected: str) -> float | None:
    """`{{.State.StartedAt.UnixNano}} {{.State.FinishedAt.UnixNano}}` as the seconds between them; None when
    podman has no start (a container that never started reports times before 1970)."""
    parts = inspected.split()
    if len(parts) != 2 or not all(p.lstrip("-").isdigit() for p in parts):
        return None
    started, finished = (int(p) for p in parts)
    if started <= 0 or finished < started:
        return None
    return (finished - started) / 1e9


def _container(row: dict[str, Any]) -> Container:
    names = row.get("Names") or [""]
    state = str(row.get("State") or "")
    exited = row.get("Exited") or state == "exited"
    return Container(
        name=str(names[0]),
        state=state,
        exit_code=int(row["ExitCode"]) if exited and row.get("ExitCode") is not None else None,
        labels={str(k): str(v) for k, v in (row.get("Labels") or {}).items()},
    )
