"""Finalize one node: run its finalize playbook through ansible-runner and report what happened.

Called by the node reconciler when a node enters `provisioning` (and again on `provision node retry`
or after a control-plane restart). It takes plain data — a FinalizeRequest built from the node record
and a target (SshTarget for a real node, ChrootTarget for a lab node's root) — and a callback that
receives every task event for the node's history. It returns a FinalizeResult: ok, or failed with the
failing task's name and Ansible's message, which the caller turns into `errored` with that reason.

Crash safety: the playbooks are idempotent, so re-running converges. What this module adds is that a
re-run never races a leftover ansible-playbook. ansible-runner starts the playbook in its own session
(pexpect) on a pty; when the control plane is SIGKILLed the pty closes and the play usually dies of
SIGHUP within ~0.1 s (measured in tests/provisioner/test_finalize_restart.py), but nothing guarantees
it, so we record its pid (with the process start time, so a recycled pid is never mistaken for it)
and stop it before starting again; a flock makes a second concurrent run of the same node a Conflict
instead of two plays on one machine.

Runner artifacts (events, stdout, the command line) stay under <home>/ansible/<node>/artifacts, the
last ARTIFACTS_KEPT runs per node. Where the home, the playbooks and the Ansible collections are comes
from the control plane's Settings (docs/control-plane.md), given to AnsibleFinalizer once.
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from contracts.errors import Conflict, InvalidInput, Unavailable
from provisioner.domain.states import Service
from provisioner.settings import SHIPPED_PLAYBOOKS, Settings

log = logging.getLogger(__name__)

PLAYBOOK_DIR = SHIPPED_PLAYBOOKS  # Settings.playbooks may point elsewhere
PLAYBOOKS: dict[Service, str] = {
    Service.COMPUTE: "finalize-compute.yml",
    Service.STORAGE: "finalize-storage.yml",
}
ARTIFACTS_KEPT = 10
STOP_GRACE_SECONDS = 5.0


# ---------------------------------------------------------------- inputs


@dataclass(frozen=True)
class FinalizeRequest:
    """What the playbook needs from the node record. Drives are the node's NVMe inventory: dicts with
    `path` (or `name`, e.g. "nvme0n1"), optional `size_bytes`, and `system: true` for the drive that
    holds the OS, which is never part of the scratch volume."""

    node_name: str
    hostname: str
    service: Service | str
    region: str
    control_plane_url: str
    nvme_drives: Sequence[Mapping[str, Any] | str] = ()
    nfs_clients: Sequence[str] = ()  # storage nodes: the region's client networks for the cache export
    extra_vars: Mapping[str, Any] = field(default_factory=dict)  # playbook defaults to override


@dataclass(frozen=True)
class SshTarget:
    """A real node, reached over SSH with the control plane's key. A non-root user escalates with sudo."""

    host: str
    key_file: Path
    user: str = "root"
    port: int = 22
    known_hosts: Path | None = None  # None: trust on first use, remembered per rigbase home


@dataclass(frozen=True)
class ChrootTarget:
    """A lab node: a debootstrap'd root directory (provisioner/lab/rootfs.py) on this machine."""

    root: Path


Target = SshTarget | ChrootTarget


# ---------------------------------------------------------------- outputs


class TaskStatus(StrEnum):
    STARTED = "started"
    OK = "ok"
    CHANGED = "changed"
    SKIPPED = "skipped"
    FAILED = "failed"
    IGNORED = "ignored"  # failed with ignore_errors: part of the play's logic, not a finalize failure
    UNREACHABLE = "unreachable"


@dataclass(frozen=True)
class FinalizeEvent:
    """One task event, as it goes into the node's history."""

    task: str
    status: TaskStatus
    host: str
    message: str | None = None
    handler: bool = False


@dataclass(frozen=True)
class FinalizeResult:
    ok: bool
    status: str  # ansible-runner's: successful, failed, timeout, canceled
    failed_task: str | None
    message: str | None
    changed: int  # tasks that changed something; 0 on a converged node
    rc: int
    seconds: float
    artifact_dir: Path


# ansible-runner event name → our status; runner_on_ok is split into ok/changed by the result
EVENT_STATUS: dict[str, TaskStatus] = {
    "playbook_on_task_start": TaskStatus.STARTED,
    "playbook_on_handler_task_start": TaskStatus.STARTED,
    "runner_on_ok": TaskStatus.OK,
    "runner_on_skipped": TaskStatus.SKIPPED,
    "runner_on_failed": TaskStatus.FAILED,
    "runner_on_unreachable": TaskStatus.UNREACHABLE,
}
FAILING = {TaskStatus.FAILED, TaskStatus.UNREACHABLE}


# ---------------------------------------------------------------- the run


class Finalizer(Protocol):
    """What the finalize reconciler runs for a node in provisioning: AnsibleFinalizer in the control
    plane; tests that only exercise the join inject one that skips the playbook."""

    def finalize(
        self,
        request: FinalizeRequest,
        target: Target,
        on_event: Callable[[FinalizeEvent], None] | None = None,
    ) -> FinalizeResult: ...


@dataclass(frozen=True)
class AnsibleFinalizer:
    """The real finalizer: the node's playbook through ansible-runner, with the settings' paths."""

    settings: Settings

    def finalize(
        self,
        request: FinalizeRequest,
        target: Target,
        on_event: Callable[[FinalizeEvent], None] | None = None,
    ) -> FinalizeResult:
        return run_finalize(request, target, on_event, settings=self.settings)


def run_finalize(
    request: FinalizeRequest,
    target: Target,
    on_event: Callable[[FinalizeEvent], None] | None = None,
    *,
    timeout: int | None = None,
    settings: Settings | None = None,
) -> FinalizeResult:
    """Run the node's finalize playbook against `target`, streaming task events to `on_event`.
    `settings` locate the home, the playbooks and the collections; a direct caller (the debugging
    entry point below, tests) may leave them to be loaded here."""
    import ansible_runner  # heavy: keep `provision --help` fast

    settings = settings or Settings.load()
    service = _service(request.service)
    _check_target(target)
    data_dir = settings.home / "ansible" / _safe_name(request.node_name)
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    (data_dir / "tmp").mkdir(exist_ok=True)
    ident = time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]
    failure: list[FinalizeEvent] = []
    pid_file = data_dir / "playbook.pid"

    def handle(raw: dict[str, Any]) -> bool:
        pid = raw.get("pid")
        if pid and not pid_file.exists():
            _record_pid(pid_file, int(pid))
        event = to_event(raw, request.node_name)
        if event is None:
            return True
        if event.status in FAILING and not failure:
            failure.append(event)
        if on_event is not None:
            try:
                on_event(event)
            except Exception:  # a history write that fails must not abort a half-done play
                log.exception("finalize event callback failed for %s", request.node_name)
        return True  # keep the event in the artifacts too

    started = time.monotonic()
    with _node_lock(data_dir, request.node_name):
        _stop_leftover(pid_file)
        runner = ansible_runner.run(
            private_data_dir=str(data_dir),
            project_dir=str(settings.playbooks),
            playbook=PLAYBOOKS[service],
            inventory=inventory_for(request.node_name, target, data_dir),
            extravars=extravars_for(request, lab=isinstance(target, ChrootTarget)),
            envvars=ansible_env(data_dir, settings.ansible_collections),
            event_handler=handle,
            ident=ident,
            rotate_artifacts=ARTIFACTS_KEPT,
            suppress_env_files=True,
            quiet=True,
            timeout=timeout,
        )
        pid_file.unlink(missing_ok=True)
    seconds = time.monotonic() - started
    artifact_dir = Path(runner.config.artifact_dir)
    changed = sum((runner.stats or {}).get("changed", {}).values())
    ok = runner.status == "successful" and runner.rc == 0
    if ok:
        return FinalizeResult(True, runner.status, None, None, changed, runner.rc, seconds, artifact_dir)
    if failure:
        task, message = failure[0].task, failure[0].message or "the task failed without a message"
    elif runner.status == "timeout":
        task, message = None, f"the playbook ran longer than {timeout} s and was stopped"
    else:  # no task failed: a syntax error, a missing collection, ansible-playbook not found
        task, message = None, _tail(artifact_dir / "stdout") or f"ansible-playbook exited with {runner.rc}"
    return FinalizeResult(False, runner.status, task, message, changed, runner.rc, seconds, artifact_dir)


def to_event(raw: Mapping[str, Any], host: str = "") -> FinalizeEvent | None:
    """An ansible-runner event as a FinalizeEvent, or None for events the history doesn't keep
    (play starts, per-item results, stats, verbose output)."""
    status = EVENT_STATUS.get(raw.get("event", ""))
    if status is None:
        return None
    data = raw.get("event_data", {})
    res = data.get("res") or {}
    if status is TaskStatus.OK and res.get("changed"):
        status = TaskStatus.CHANGED
    if status is TaskStatus.FAILED and data.get("ignore_errors"):
        status = TaskStatus.IGNORED
    return FinalizeEvent(
        task=data.get("task") or data.get("name") or "?",
        status=status,
        host=data.get("host") or host,  # task starts carry no host; a finalize has exactly one
        message=_message(res) if status in FAILING | {TaskStatus.IGNORED} else None,
        handler=raw.get("event") == "playbook_on_handler_task_start" or bool(data.get("is_handler")),
    )


def _message(res: Mapping[str, Any]) -> str:
    """The most useful line Ansible gave for a failure (assert's fail_msg, a module's msg, stderr)."""
    for key in ("msg", "stderr", "module_stderr", "stdout"):
        value = res.get(key)
        if value:
            return " ".join(str(value).split())[:1000]
    return "the task failed without a message"


# ---------------------------------------------------------------- what the run is given


def extravars_for(request: FinalizeRequest, *, lab: bool) -> dict[str, Any]:
    """The playbook's variables. `rigbase_lab` is always explicit: it decides whether devices and
    running services are touched, and the playbook checks it against the connection."""
    return {
        "rigbase_node_name": request.node_name,
        "rigbase_hostname": request.hostname,
        "rigbase_service": str(request.service),
        "rigbase_region": request.region,
        "rigbase_control_plane_url": request.control_plane_url,
        "rigbase_nvme_drives": scratch_drives(request.nvme_drives),
        "rigbase_nfs_clients": list(request.nfs_clients),
        "rigbase_lab": lab,
        **dict(request.extra_vars),
    }


def scratch_drives(inventory: Sequence[Mapping[str, Any] | str]) -> list[dict[str, Any]]:
    """The NVMe drives that may hold scratch: every inventoried NVMe namespace except one marked
    `system` (lab profiles mark it; on a real node the playbook also leaves out any drive it finds
    mounted). Accepts the minion's inventory drives as they are: non-NVMe kinds are dropped."""
    drives: dict[str, dict[str, Any]] = {}
    for item in inventory:
        entry: Mapping[str, Any] = {"path": item} if isinstance(item, str) else item
        if entry.get("kind", "nvme") != "nvme":
            continue
        path = str(entry.get("path") or "")
        if not path and entry.get("name"):
            path = "/dev/" + str(entry["name"]).removeprefix("/dev/")
        if not path:
            raise InvalidInput(
                f"an NVMe drive in the inventory has no path or name ({dict(entry)}); "
                "re-run the minion's inventory."
            )
        if entry.get("system"):
            continue
        drives[path] = {"path": path, "size_bytes": int(entry.get("size_bytes") or 0)}
    return [drives[p] for p in sorted(drives)]


def inventory_for(name: str, target: Target, data_dir: Path) -> dict[str, Any]:
    if isinstance(target, ChrootTarget):
        hostvars: dict[str, Any] = {
            "ansible_connection": "community.general.chroot",
            "ansible_host": str(target.root.resolve()),
            "ansible_python_interpreter": "/usr/bin/python3",
        }
    else:
        known = target.known_hosts or data_dir.parent / "known_hosts"
        strict = "yes" if target.known_hosts else "accept-new"
        hostvars = {
            "ansible_connection": "ssh",
            "ansible_host": target.host,
            "ansible_port": target.port,
            "ansible_user": target.user,
            "ansible_ssh_private_key_file": str(target.key_file),
            "ansible_ssh_common_args": f"-o UserKnownHostsFile={known} -o StrictHostKeyChecking={strict}"
            " -o BatchMode=yes -o ConnectTimeout=15",
            "ansible_become": target.user != "root",
            "ansible_python_interpreter": "auto_silent",
        }
    return {"all": {"hosts": {name: hostvars}}}


def ansible_env(data_dir: Path, coll: Path) -> dict[str, str]:
    """Environment for ansible-playbook: the venv's bin first on PATH (else runner can't find
    ansible-playbook: rc 127), our collections (`coll`, where scripts/install-deps.sh unpacked
    community.general), temp files under the node's data dir, no colour."""
    if not (coll / "ansible_collections/community/general/plugins/connection/chroot.py").exists():
        raise Unavailable(
            f"the community.general Ansible collection is missing from {coll}; run scripts/install-deps.sh."
        )
    path = os.pathsep.join([str(Path(sys.prefix) / "bin"), os.environ.get("PATH", ""), "/usr/sbin:/sbin"])
    return {
        "PATH": path,
        "ANSIBLE_COLLECTIONS_PATH": str(coll),
        "ANSIBLE_LOCAL_TEMP": str(data_dir / "tmp"),
        "ANSIBLE_PIPELINING": "True",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_RETRY_FILES_ENABLED": "False",
        "ANSIBLE_DEPRECATION_WARNINGS": "False",
        "ANSIBLE_HOST_KEY_CHECKING": "True",
    }


# ---------------------------------------------------------------- checks, locks, leftovers


def _service(value: Service | str) -> Service:
    try:
        return Service(value)
    except ValueError:
        raise InvalidInput(
            f"{value!r} is not a node service; use one of {', '.join(s.value for s in Service)}."
        ) from None


def _check_target(target: Target) -> None:
    if isinstance(target, ChrootTarget):
        if not (target.root / "usr/bin/python3").exists():
            raise InvalidInput(
                f"{target.root} is not a lab root with python3 in it; "
                "build it with provisioner.lab.rootfs.root_for_node()."
            )
    elif isinstance(target, SshTarget):
        if not Path(target.key_file).is_file():
            raise InvalidInput(
                f"SSH key {target.key_file} does not exist; give the control plane's node key."
            )
    else:
        raise InvalidInput(f"unknown finalize target {target!r}; use SshTarget or ChrootTarget.")


def _safe_name(name: str) -> str:
    if not name or "/" in name or name.startswith("."):
        raise InvalidInput(f"{name!r} is not a valid node name; use lowercase letters, digits and '-'.")
    return name


@contextmanager
def _node_lock(data_dir: Path, name: str) -> Iterator[None]:
    with open(data_dir / "lock", "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Conflict(f"finalize of node {name} is already running; wait for it to finish.") from None
        yield


def process_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks (field 22 of /proc/PID/stat); None once it is gone
    or a zombie (dead, waiting for a parent to reap it). With the pid it names one process for good:
    a reused pid has another start time. Also used by the lab (provisioner/lab/state.py)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()  # comm may hold ")"
    except OSError:
        return None
    return None if fields[0] == "Z" else int(fields[19])


def _record_pid(pid_file: Path, pid: int) -> None:
    start = process_start_time(pid)
    if start is not None:
        pid_file.write_text(f"{pid} {start}\n")


def _stop_leftover(pid_file: Path) -> None:
    """Stop an ansible-playbook a crashed control plane left running for this node (see module doc)."""
    try:
        pid, start = (int(f) for f in pid_file.read_text().split())
    except (OSError, ValueError):
        pid_file.unlink(missing_ok=True)
        return
    if process_start_time(pid) == start:
        log.warning("stopping leftover ansible-playbook %d from an interrupted finalize", pid)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(os.getpgid(pid), sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + STOP_GRACE_SECONDS
            while time.monotonic() < deadline and process_start_time(pid) == start:
                time.sleep(0.1)
            if process_start_time(pid) != start:
                break
    pid_file.unlink(missing_ok=True)


def _tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " / ".join(line.strip() for line in text[-lines:] if line.strip())[:1000]


# ---------------------------------------------------------------- debugging entry point


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m provisioner.adapters.ansible NODE.json --chroot DIR | --ssh HOST --key FILE`:
    run one finalize outside the control plane, events as JSON lines on stdout. Exit 0 ok, 1 failed."""
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="python -m provisioner.adapters.ansible")
    parser.add_argument("node", type=Path, help="JSON file with the FinalizeRequest fields")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--chroot", type=Path, help="a lab node's root directory")
    where.add_argument("--ssh", metavar="HOST", help="a real node's address")
    parser.add_argument("--key", type=Path, help="SSH private key (with --ssh)")
    parser.add_argument("--user", default="root")
    args = parser.parse_args(argv)
    request = FinalizeRequest(**json.loads(args.node.read_text()))
    target: Target
    if args.chroot:
        target = ChrootTarget(args.chroot)
    elif args.key is None:
        parser.error("--ssh needs --key")
    else:
        target = SshTarget(args.ssh, args.key, user=args.user)

    def emit(event: FinalizeEvent) -> None:
        print(
            json.dumps(
                {
                    "task": event.task,
                    "status": event.status.value,
                    "host": event.host,
                    "message": event.message,
                }
            ),
            flush=True,
        )

    result = run_finalize(request, target, emit)
    print(
        json.dumps(
            {
                "ok": result.ok,
                "failed_task": result.failed_task,
                "message": result.message,
                "changed": result.changed,
                "seconds": round(result.seconds, 2),
            }
        ),
        flush=True,
    )
    return 0 if result.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
