"""Run one finalize work's playbook on this node through ansible-runner and say how it ended.

One code path for real and lab nodes: on a real node the play runs with the `local` connection; a lab
minion (`minion run --host-root DIR`) runs it through `community.general.chroot` into DIR, its
debootstrap'd root, with rigbase_lab=true (devices and running services are left alone there; the
configuration files are written into the root). The playbooks are idempotent, so a re-run converges; a
killed minion's leftover play is stopped first (process.py). Runner artifacts (events, stdout, the command
line) stay under <state>/finalize/runner/artifacts, the last ARTIFACTS_KEPT runs."""

from __future__ import annotations

import logging
import os
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypedDict

from contracts.finalize import (
    FAILING,
    MESSAGE_MAX,
    MODULE_PYTHON,
    FinalizeEvent,
    FinalizeOutcome,
    FinalizeWork,
)
from minion.finalize.events import to_event
from minion.finalize.paths import FinalizePaths
from minion.finalize.process import exclusive, record_pid, stop_leftover
from minion.settings import ANSIBLE_COLLECTIONS_SEARCH

log = logging.getLogger(__name__)

ARTIFACTS_KEPT: Final = 10
# What the saved play leaves out when it runs again at boot (`minion finalize apply-saved`): tasks whose
# work lives on the drives themselves and survives a reboot (partitions, RAID superblocks, filesystems;
# udev assembles the arrays at boot). The first run and every new generation run them; on a TCG guest they
# are a fifth of the boot's play.
BOOT_SKIP_TAGS: Final = "disk-setup"
HOST: Final = "node"  # the inventory's one host: the node itself
CHROOT_PLUGIN: Final = "community/general/plugins/connection/chroot.py"
# files the play writes that become the report's facts (what the operator sees of the layout)
FACT_FILES: Final = {"scratch": "etc/rigbase/scratch.yaml", "storage": "etc/rigbase/storage.yaml"}
# Written by the image builder into every node image. Without --host-root the play changes this machine's
# hostname, fstab and drives: it runs only where this file says the machine is a rigbase node, never on a
# developer's or CI machine that happens to run `minion run` against a control plane.
NODE_IMAGE_MARKER: Final = Path("/etc/rigbase/image-version")


def not_a_node(host_root: Path | None, marker: Path = NODE_IMAGE_MARKER) -> str | None:
    """Why this machine must not be finalized in place, or None."""
    if host_root is not None or marker.exists():
        return None
    return (
        f"this machine is not a rigbase node ({marker} is missing): finalize runs on a node booted from a "
        "rigbase image, or in a lab root given with --host-root"
    )


class CollectionsMissing(RuntimeError):
    """community.general is nowhere to be found; the message says where it was looked for."""


@dataclass(frozen=True)
class RunResult:
    outcome: FinalizeOutcome
    facts: dict[str, Any] = field(default_factory=dict)
    artifact_dir: Path | None = None


class RunOptions(TypedDict, total=False):
    """run_work's keyword arguments, for callers that pass them through (apply.apply_work)."""

    host_root: Path | None
    collections: Path | None
    on_event: Callable[[FinalizeEvent], None] | None
    timeout: int | None
    skip_tags: str | None


def find_collections(configured: Path | None, search: Iterable[Path] = ANSIBLE_COLLECTIONS_SEARCH) -> Path:
    """The collections directory: the configured one (RIGBASE_ANSIBLE_COLLECTIONS), else the first of
    `search` that holds community.general."""
    candidates = [configured] if configured is not None else list(search)
    for path in candidates:
        if (path / "ansible_collections" / CHROOT_PLUGIN).exists():
            return path
    raise CollectionsMissing(
        "the community.general Ansible collection is missing from "
        f"{' and '.join(map(str, candidates))}; run scripts/install-deps.sh "
        "or set RIGBASE_ANSIBLE_COLLECTIONS"
    )


def module_interpreter(path: str | None = None) -> str:
    """The node's module Python (module_python.py), on PATH or beside the minion's own launcher where the
    image or the device bundle installs it; else this interpreter."""
    beside = str(Path(sys.argv[0]).resolve().parent) if sys.argv and sys.argv[0] else None
    search = os.pathsep.join(p for p in (path, beside) if p)
    return shutil.which(MODULE_PYTHON, path=search or None) or sys.executable


def inventory_for(host_root: Path | None, interpreter: str | None = None) -> dict[str, Any]:
    if host_root is None:
        hostvars: dict[str, Any] = {
            "ansible_connection": "local",
            "ansible_python_interpreter": interpreter or module_interpreter(),
        }
    else:
        hostvars = {
            "ansible_connection": "community.general.chroot",
            "ansible_host": str(host_root.resolve()),
            "ansible_python_interpreter": "/usr/bin/python3",
        }
    return {"all": {"hosts": {HOST: hostvars}}}


def extravars_for(work: FinalizeWork, host_root: Path | None) -> dict[str, Any]:
    """The control plane's variables, and `rigbase_lab`, which only the minion decides: true exactly when
    it runs in a chroot of its --host-root (the playbook checks it against the connection)."""
    return {**work.variables, "rigbase_lab": host_root is not None}


def ansible_env(data_dir: Path, collections: Path, *, local: bool) -> dict[str, str]:
    """The venv's bin first on PATH (else runner can't find ansible-playbook: rc 127), sbin for mdadm and
    friends, our collections, temp files under the state dir, a UTF-8 locale (ansible-core refuses to
    start without one), no colour."""
    path = os.pathsep.join([str(Path(sys.prefix) / "bin"), os.environ.get("PATH", ""), "/usr/sbin:/sbin"])
    env = {
        "PATH": path,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "ANSIBLE_COLLECTIONS_PATH": str(collections),
        "ANSIBLE_LOCAL_TEMP": str(data_dir / "tmp"),
        "ANSIBLE_PIPELINING": "True",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_RETRY_FILES_ENABLED": "False",
        "ANSIBLE_DEPRECATION_WARNINGS": "False",
        # a lab minion runs under umockdev-run, whose preload library (simulated sysfs/dev) neither exists
        # in the chroot nor has any business in the play's view of /dev
        "LD_PRELOAD": "",
    }
    if local:  # the node's home may be on the read-only root; in a chroot the path is the root's own
        env["ANSIBLE_REMOTE_TEMP"] = str(data_dir / "tmp")
    return env


def run_work(
    work: FinalizeWork,
    project: Path,
    paths: FinalizePaths,
    *,
    host_root: Path | None = None,
    collections: Path | None = None,
    on_event: Callable[[FinalizeEvent], None] | None = None,
    timeout: int | None = None,
    skip_tags: str | None = None,
) -> RunResult:
    """Run `work.playbook` from the unpacked bundle `project`, streaming task events to `on_event`, without
    the tasks tagged `skip_tags` (BOOT_SKIP_TAGS at boot). Raises process.RunBusy when another run holds
    the lock; every other failure is a failed outcome."""
    started = time.monotonic()
    coll = _ready_to_run(work, project, host_root, collections)
    if isinstance(coll, str):
        return _failed(coll)
    import ansible_runner  # heavy: keep `minion --help` fast

    data_dir = paths.runner
    (data_dir / "tmp").mkdir(parents=True, exist_ok=True, mode=0o700)
    events = _Events(paths, on_event)
    env = ansible_env(data_dir, coll, local=host_root is None)
    with exclusive(paths.lock):
        stop_leftover(paths.pid_file)
        runner = ansible_runner.run(
            private_data_dir=str(data_dir),
            project_dir=str(project),
            playbook=work.playbook,
            inventory=inventory_for(host_root, module_interpreter(env["PATH"])),
            extravars=extravars_for(work, host_root),
            envvars=env,
            event_handler=events.handle,
            ident=time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6],
            rotate_artifacts=ARTIFACTS_KEPT,
            suppress_env_files=True,
            quiet=True,
            timeout=timeout,
            skip_tags=skip_tags,
        )
        paths.pid_file.unlink(missing_ok=True)
    return _result(runner, events.failure, timeout, round(time.monotonic() - started, 3), host_root)


def _ready_to_run(
    work: FinalizeWork, project: Path, host_root: Path | None, collections: Path | None
) -> Path | str:
    """Where community.general is, or why the play cannot run here."""
    if refusal := not_a_node(host_root):
        return refusal
    if host_root is not None and not (host_root / "usr/bin/python3").exists():
        return f"{host_root} has no usr/bin/python3: --host-root must be a node root to chroot into"
    if not (project / work.playbook).is_file():
        return f"the playbook bundle has no {work.playbook}"
    try:
        return find_collections(collections)
    except CollectionsMissing as exc:
        return str(exc)


class _Events:
    """ansible-runner's event handler: the play's pid for a later run to stop, each task event to
    `on_event`, and the first failing task."""

    def __init__(self, paths: FinalizePaths, on_event: Callable[[FinalizeEvent], None] | None) -> None:
        self.paths, self.on_event = paths, on_event
        self.failure: FinalizeEvent | None = None

    def handle(self, raw: dict[str, Any]) -> bool:
        pid = raw.get("pid")
        if pid and not self.paths.pid_file.exists():
            record_pid(self.paths.pid_file, int(pid))
        event = to_event(raw)
        if event is None:
            return True
        if event.status in FAILING and self.failure is None:
            self.failure = event
        if self.on_event is not None:
            try:
                self.on_event(event)
            except Exception:  # a report that fails to queue must not abort a half-done play
                log.exception("finalize event callback failed")
        return True  # keep the event in the artifacts too


def _result(
    runner: Any, failure: FinalizeEvent | None, timeout: int | None, seconds: float, host_root: Path | None
) -> RunResult:
    artifact_dir = Path(runner.config.artifact_dir)
    changed = sum((runner.stats or {}).get("changed", {}).values())
    facts = read_facts(host_root)
    if runner.status == "successful" and runner.rc == 0:
        return RunResult(FinalizeOutcome(ok=True, changed=changed, seconds=seconds), facts, artifact_dir)
    if failure is not None:
        task, message = failure.task, failure.message or "the task failed without a message"
    elif runner.status == "timeout":
        task, message = None, f"the playbook ran longer than {timeout} s and was stopped"
    else:  # no task failed: a syntax error, a missing collection, ansible-playbook not found
        task, message = None, _tail(artifact_dir / "stdout") or f"ansible-playbook exited with {runner.rc}"
    outcome = FinalizeOutcome(ok=False, failed_task=task, message=message, changed=changed, seconds=seconds)
    return RunResult(outcome, facts, artifact_dir)


def read_facts(host_root: Path | None) -> dict[str, Any]:
    """What the play recorded of the node's storage (scratch device and mount, cache, NFS export)."""
    import yaml

    facts: dict[str, Any] = {}
    for key, rel in FACT_FILES.items():
        try:
            data = yaml.safe_load(((host_root or Path("/")) / rel).read_text())
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(data, dict):
            facts[key] = data
    return facts


def _failed(message: str) -> RunResult:
    return RunResult(FinalizeOutcome(ok=False, message=message[:MESSAGE_MAX]))


def _tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " / ".join(line.strip() for line in text[-lines:] if line.strip())[:MESSAGE_MAX]
