"""One worker's life on the node, in its own thread: start (or adopt) its container, follow it, stop it
when asked, collect its exit code, ship its output, clean up.

The heartbeat never waits for any of it: the agent only reads `report()`. Everything a restarted minion
needs lives outside the process — the container and its labels (podman), the k8s-file log and the log
checkpoint, the bind mounts and `report.json` (the outcome, written before the container is removed) in
the worker's directory STATE/jobs/JOB/WORKER/GENERATION."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from contracts.jobs import (
    ENDED,
    USAGE_PER_REPORT,
    DatastoreAccess,
    ServeBinding,
    WorkerAssignment,
    WorkerReport,
    WorkerRunState,
)
from minion.durable import write_atomic
from minion.jobs import served, usage
from minion.jobs.container import (
    EnvRefused,
    RunPlan,
    auth_document,
    container_name,
    environment,
    is_customers,
    write_env_file,
    write_private,
)
from minion.jobs.gpus import GpuPool, NotEnoughGpus
from minion.jobs.images import ImageBook
from minion.jobs.logs import LogShipper, LogTransport, LogUnavailable, last_lines
from minion.jobs.mounts import Bound, MountRefused, bind_all, unbind_all
from minion.jobs.objects import ObjectCache, ObjectWait
from minion.jobs.outputs import OutputRefused, OutputSink, OutputUnavailable, upload
from minion.jobs.podman import RUN_TIMEOUT_S, Container, Podman, PodmanError
from minion.jobs.usage import UsageSampler
from minion.settings import ContainerSettings

log = logging.getLogger(__name__)

POLL_S: Final = 1.0  # how often a running worker's log is shipped and its stop/disk checked
CACHE_RETRY_S: Final = 5.0  # how often a worker waiting for room in the object cache tries again
DISK_CHECK_S: Final = 15.0  # the best-effort disk quota's measuring interval (disk_quota = "watch")
IDLE_CHECK_S: Final = 30.0  # how often a running notebook's idle time is read from Jupyter
NOTEBOOK_TOKEN: Final = "JUPYTER_TOKEN"  # the notebook's token, in its environment (docs/job-urls.md)
LOG_RETRY_S: Final = 5.0  # an ended worker retries an unreachable receiver this often
MESSAGE_MAX: Final = 1000
RESTARTS: Final = 3  # a notebook's or endpoint's server that exits is started again this often, then fails
RESTART_PAUSE_S: Final = 1.0  # the pause before the first restart, doubled before each next one
LAST_LINES: Final = 5  # of its log, in the reason of a served worker that kept exiting


@dataclass(frozen=True)
class ContainerRuntime:
    """What every worker of one agent shares."""

    podman: Podman
    settings: ContainerSettings
    gpus: GpuPool
    transport: LogTransport
    owner: str  # this minion's label value (rigbase.owner)
    root: Path  # STATE/jobs
    closing: threading.Event  # the agent shuts down: threads return, containers keep running
    objects: ObjectCache | None = None  # datasets, models and checkpoints, fetched by digest
    outputs: OutputSink | None = None  # where a worker's own /opt/ml/output goes when it ends
    images: ImageBook | None = None  # what the node's images are, for the control plane's dry run


def disk_used(path: str) -> int:
    """Bytes allocated below `path` (not following symlinks, staying on its filesystem)."""
    total = 0
    device = os.lstat(path).st_dev
    for directory, dirs, files in os.walk(path):
        for name in files + dirs:
            try:
                st = os.lstat(os.path.join(directory, name))
            except OSError:
                continue
            if st.st_dev == device:
                total += st.st_blocks * 512
    return total


class Worker:
    def __init__(
        self,
        rt: ContainerRuntime,
        assignment: WorkerAssignment,
        access: dict[str, DatastoreAccess],
        found: Container | None = None,
    ) -> None:
        self.rt = rt
        self.assignment = assignment
        self.access = access
        self.found = found  # a container of this worker that already exists (a restarted minion)
        self.name = container_name(rt.owner, assignment.job_id, assignment.worker)
        self.dir = rt.root / assignment.job_id / str(assignment.worker) / assignment.generation
        self.stop_requested = threading.Event()
        self.cleaned = threading.Event()  # its container is removed and its GPUs free
        self.lock = threading.Lock()
        self.state = WorkerRunState.STARTING
        self.exit_code: int | None = None
        self.message: str | None = None
        self.ran_s: float | None = None  # how long its container ran, once it ended
        self.started_mono: float | None = None  # when this minion saw `podman run -d` return
        self.gpu_indices: list[int] = []
        self.usage: UsageSampler | None = None  # while its container runs
        self.address: str | None = None  # where the node reaches its running container (its server)
        self.last_stream_mono: float | None = None  # the tunnel's last connection to it (an endpoint's use)
        self.idle: tuple[float, float] | None = None  # its server's idle seconds, and when they were measured
        self.next_idle_check = 0.0
        self.restarts = 0  # times its server was started again after it exited (_restarted)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.shipper = LogShipper(
            assignment.job_id,
            assignment.worker,
            assignment.generation,
            self.dir / "output.log",
            self.dir / "log-checkpoint.json",
            rt.transport,
        )
        self._load_outcome()
        if assignment.stop:
            self.stop_requested.set()
        self.thread = threading.Thread(target=self._life, name=f"job-{self.name}", daemon=True)

    # -- what the agent sees ---------------------------------------------------------------------------
    @property
    def key(self) -> tuple[str, int]:
        return self.assignment.key

    def update(self, assignment: WorkerAssignment, access: dict[str, DatastoreAccess]) -> None:
        self.assignment, self.access = assignment, access
        if assignment.stop:
            self.stop_requested.set()

    def report(self, samples: int = USAGE_PER_REPORT) -> WorkerReport:
        """What the heartbeat says of it, with at most `samples` of its latest usage samples."""
        usage = self.usage.latest(samples) if self.usage is not None else []
        with self.lock:
            return WorkerReport(
                job_id=self.assignment.job_id,
                worker=self.assignment.worker,
                generation=self.assignment.generation,
                state=self.state,
                exit_code=self.exit_code,
                message=self.message[:MESSAGE_MAX] if self.message else None,
                gpu_indices=self.gpu_indices,
                log_acked=self.shipper.state.acked,
                log_eof=self.shipper.state.eof,
                usage=usage,
                ran_s=self.ran_s,
                idle_s=self.idle_s(),
            )

    def idle_s(self) -> float | None:
        if self.idle is None or self.state is not WorkerRunState.RUNNING:
            return None
        seconds, at = self.idle
        return round(seconds + time.monotonic() - at, 1)

    def touched(self) -> None:
        """The tunnel carries a connection to it: an endpoint is in use."""
        self.last_stream_mono = time.monotonic()
        if self.assignment.serve is not None and self.assignment.serve.status_path is None:
            self.idle = (0.0, self.last_stream_mono)

    @property
    def finished(self) -> bool:
        """Ended, cleaned up and its output shipped (or the receiver no longer wants it)."""
        return self.state in ENDED and not self.thread.is_alive()

    # -- its life ----------------------------------------------------------------------------------------
    def _set(self, state: WorkerRunState, exit_code: int | None = None, message: str | None = None) -> None:
        with self.lock:
            self.state, self.exit_code, self.message = state, exit_code, message

    def _life(self) -> None:
        try:
            if self.state not in ENDED:
                self._run()
            elif self.found is not None:  # ended, but the minion died before removing it
                self._clean_up()
            if self.state in ENDED:  # not when the minion stopped while the container runs on
                self._ship_rest()
        except Exception as exc:
            log.exception("worker %s crashed", self.name)
            if self.state not in ENDED:
                self._set(WorkerRunState.FAILED_TO_START, message=f"the minion's job runner crashed: {exc}")
                self._save_outcome()

    def _run(self) -> None:
        found = self.found
        if found is not None and found.running:
            self.gpu_indices = found.gpus
            self.rt.gpus.adopt(self.key, found.gpus)
            self._set(*self._started())
        elif found is not None and found.state in ("exited", "stopped") and found.exit_code is not None:
            self.gpu_indices = found.gpus
            self._end(found.exit_code)  # it ended while the minion was away
            return
        else:
            if found is not None:  # created but never started (the minion died mid-start): start over
                self.rt.podman.remove(self.name)
            if not self._start():
                return
        while (ended := self._follow()) is not None:
            code, note = ended
            if note is not None or not self._restarted(code):
                self._end(code, self._last_words(code) if self.restarts else note)
                return

    def _start(self) -> bool:
        a = self.assignment
        if self.stop_requested.is_set():
            self._fail(WorkerRunState.STOPPED, "stopped before it started")
            return False
        try:
            self.gpu_indices = self.rt.gpus.take(self.key, a.gpu_count)
            bound = self._bind_when_room()
            if bound is None:
                self._fail(WorkerRunState.STOPPED, "stopped before it started (it waited for its data)")
                return False
            env_file, auth_file = self.dir / "env", self.dir / "auth.json"
            write_env_file(env_file, environment(a, self.gpu_indices))
            if is_customers(a):
                write_private(auth_file, auth_document(a))
            plan = RunPlan(
                self.name,
                self.rt.owner,
                a,
                self.gpu_indices,
                bound,
                self.dir / "output.log",
                env_file,
                auth_file,
            )
            try:
                self.rt.podman.call(plan.args(self.rt.settings), timeout=RUN_TIMEOUT_S)
            except PodmanError as exc:
                if self.rt.images is not None:
                    self.rt.images.started(a.image, str(exc))
                raise
            if self.rt.images is not None:
                self.rt.images.started(a.image, None)
        except (NotEnoughGpus, MountRefused, EnvRefused, PodmanError) as exc:
            self._fail(WorkerRunState.FAILED_TO_START, str(exc))
            return False
        finally:  # podman has read them; secrets stay off the disk
            (self.dir / "env").unlink(missing_ok=True)
            (self.dir / "auth.json").unlink(missing_ok=True)
        self.started_mono = time.monotonic()
        self._set(*self._started())
        return True

    def _started(self) -> tuple[WorkerRunState, None, str | None]:
        """A started container is running, unless it serves (a notebook, an endpoint): that one is running
        only once its server answers (served.check)."""
        serve = self.assignment.serve
        if serve is None:
            return WorkerRunState.RUNNING, None, None
        return WorkerRunState.STARTING, None, served.waiting(serve, "its container started")

    def _bind_when_room(self) -> list[Bound] | None:
        """The worker's mounts, waiting while its data cannot be had yet (no room in the node's object
        cache, or not yet in the region's: the reason is the worker's message); None when it was stopped
        meanwhile."""
        a = self.assignment
        while True:
            try:
                return bind_all(
                    a.mounts,
                    self.dir,
                    self.rt.settings,
                    self.access,
                    a.userns,
                    objects=self.rt.objects,
                    progress=lambda note: self._set(WorkerRunState.STARTING, message=note),
                )
            except ObjectWait as exc:
                self._set(WorkerRunState.STARTING, message=str(exc))
            if self.stop_requested.wait(CACHE_RETRY_S) or self.rt.closing.is_set():
                return None

    def _follow(self) -> tuple[int | None, str | None] | None:
        """Until the container ends: ship its log, pass on a stop, watch the disk quota. Its exit code and
        why it was stopped (over its quota); None when the minion shuts down while it runs on."""
        waiter = self.rt.podman.wait(self.name)
        stopper: threading.Thread | None = None
        quota_note: str | None = None
        next_disk = time.monotonic() + DISK_CHECK_S
        every = self.rt.settings.usage_sample_s
        next_sample = time.monotonic() + every
        self.usage = self._sampler()
        while True:
            try:
                out, _ = waiter.communicate(timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                pass
            if self.rt.closing.is_set():  # the minion stops; the container runs on and is adopted later
                waiter.kill()
                waiter.wait()
                return None
            self._pump(ended=False)
            self._check_server()
            if self.stop_requested.is_set() and stopper is None:
                stopper = self._stop_in_background()
            if self.usage is not None and time.monotonic() >= next_sample:
                next_sample = time.monotonic() + every
                self._sample()
            if time.monotonic() >= next_disk and stopper is None:
                next_disk = time.monotonic() + DISK_CHECK_S
                quota_note = self._over_quota()
                if quota_note:
                    stopper = self._stop_in_background()
        if stopper is not None:
            stopper.join()
        code = int(out.strip()) if out.strip().lstrip("-").isdigit() else None
        if code is None:
            found = self.rt.podman.find(self.name)
            code = found.exit_code if found else None
        return code, quota_note

    def _restarted(self, code: int | None) -> bool:
        """A served worker whose server exited on its own is started again, at most RESTARTS times, after
        a growing pause; the same container, so its log goes on where it was."""
        if self.assignment.serve is None or self.stop_requested.is_set() or self.restarts >= RESTARTS:
            return False
        self.restarts += 1
        note = f"its server exited with code {code}; starting it again ({self.restarts} of {RESTARTS})"
        self._set(WorkerRunState.STARTING, message=note)
        if self.stop_requested.wait(RESTART_PAUSE_S * 2 ** (self.restarts - 1)) or self.rt.closing.is_set():
            return False
        try:
            self.rt.podman.call(["start", self.name])
        except PodmanError as exc:
            log.warning("restarting %s: %s", self.name, exc)
            return False
        self.address, self.idle = None, None
        return True

    def _last_words(self, code: int | None) -> str:
        """Why a served worker's job fails: its server kept exiting; its last lines say how."""
        tail = last_lines(self.dir / "output.log", LAST_LINES)
        said = " | ".join(tail) if tail else "it wrote nothing"
        return f"its server exited {self.restarts + 1} times (last code {code}); its last lines: {said}"

    def _check_server(self) -> None:
        """Running once its server answers its health path; until then starting, with why not. Once
        running, a notebook's idle time is read from Jupyter now and then."""
        serve = self.assignment.serve
        if serve is None:
            return
        if self.state is WorkerRunState.RUNNING:
            self._measure_idle(serve)
            return
        if self.state is not WorkerRunState.STARTING:
            return
        if self.address is None:
            self.address = self.rt.podman.address(self.name)
        if self.address is None:
            return
        note = served.check(self.address, serve)
        if note is None:
            self._set(WorkerRunState.RUNNING)
            self._measure_idle(serve)
        elif not self.stop_requested.is_set():
            self._set(WorkerRunState.STARTING, message=note)

    def _measure_idle(self, serve: ServeBinding) -> None:
        now = time.monotonic()
        if serve.status_path is None:  # an endpoint: idle since its last connection, or since it answered
            if self.idle is None:
                self.idle = (0.0, now)
            return
        if now < self.next_idle_check or self.address is None:
            return
        self.next_idle_check = now + IDLE_CHECK_S
        token = self.assignment.env.get(NOTEBOOK_TOKEN)
        seconds = served.notebook_idle_s(self.address, serve, token, datetime.now(UTC))
        if seconds is not None:
            self.idle = (seconds, now)

    def serving_address(self) -> str | None:
        """Where the tunnel dials its ports: its container's address, while it runs (or its server starts)."""
        if self.state not in (WorkerRunState.RUNNING, WorkerRunState.STARTING):
            return None
        if self.address is None and (self.started_mono is not None or self.found is not None):
            self.address = self.rt.podman.address(self.name)
        return self.address

    def _sampler(self) -> UsageSampler | None:
        """The usage sampler of its running container; None when podman cannot say where it runs."""
        found = self.rt.podman.pid_and_upper_dir(self.name)
        if found is None:
            return None
        pid, upper = found
        indices = list(self.gpu_indices)
        return UsageSampler(
            pid,
            disk=lambda: (disk_used(upper) if upper else 0) + self._own_output_bytes(),
            gpus=lambda: usage.gpu_usage(indices),
        )

    def _sample(self) -> None:
        assert self.usage is not None
        try:
            self.usage.sample()
        except (OSError, ValueError) as exc:  # a process that just ended, a counter of another form
            log.debug("sampling %s: %s", self.name, exc)

    def _stop_in_background(self) -> threading.Thread:
        def stop() -> None:
            try:
                self.rt.podman.stop(self.name, self.assignment.stop_grace_s)
            except PodmanError as exc:
                log.warning("stopping %s: %s", self.name, exc)

        thread = threading.Thread(target=stop, name=f"stop-{self.name}", daemon=True)
        thread.start()
        return thread

    def _own_output_bytes(self) -> int:
        """Its own /opt/ml/output on the node's disk (none when a mount took that path: the datastore's)."""
        own = self.dir / "output"
        return disk_used(str(own)) if own.is_dir() else 0

    def _over_quota(self) -> str | None:
        """`watch` counts the container disk and its own output; `storage-opt` leaves the container disk
        to podman's hard limit and counts the output, which that limit does not reach."""
        limit_gb = self.assignment.disk_gb
        mode = self.rt.settings.disk_quota
        if mode == "off" or not limit_gb:
            return None
        upper = self.rt.podman.upper_dir(self.name) if mode == "watch" else None
        used = (disk_used(upper) if upper else 0) + self._own_output_bytes()
        if used <= limit_gb * 2**30:
            return None
        where = "container disk and output" if mode == "watch" else "output"
        return f"stopped: wrote {used / 2**30:.1f} GB to its {where}, over its {limit_gb} GB quota"

    def _end(self, exit_code: int | None, note: str | None = None) -> None:
        stopped = self.stop_requested.is_set() and note is None
        state = WorkerRunState.STOPPED if stopped else WorkerRunState.EXITED
        self.ran_s = self.rt.podman.ran_s(self.name)  # before the container is removed
        if self.ran_s is None and self.started_mono is not None:  # podman could not say (busy, gone)
            self.ran_s = time.monotonic() - self.started_mono
        self._set(state, exit_code, note or (None if exit_code is not None else "exit code unknown"))
        self._save_outcome()
        self._clean_up()

    def _fail(self, state: WorkerRunState, message: str) -> None:
        self._set(state, None, message)
        self._save_outcome()
        self._clean_up()

    def _clean_up(self) -> None:
        try:
            self.rt.podman.remove(self.name)
        except PodmanError as exc:
            log.warning("removing %s: %s", self.name, exc)
        try:
            unbind_all(self.dir)
        except Exception as exc:
            log.warning("unmounting the data of %s: %s", self.name, exc)
        self.rt.gpus.release(self.key)
        self.cleaned.set()

    # -- output --------------------------------------------------------------------------------------
    def _pump(self, ended: bool) -> bool:
        try:
            return self.shipper.pump(ended)
        except LogUnavailable as exc:
            log.info("log of %s not shipped yet: %s", self.name, exc)
            return False

    def _ship_rest(self) -> None:
        """The output first, then the rest of the log and its end: a closed log tells the control plane
        the worker has nothing more to send."""
        while not self._ship_output():
            if self.rt.closing.wait(LOG_RETRY_S):
                return
        while not self._pump(ended=True):
            if self.rt.closing.wait(LOG_RETRY_S):
                return

    def _ship_output(self) -> bool:
        """Its own /opt/ml/output sent (True also when there is none: a datastore output, never started)."""
        own, sent = self.dir / "output", self.dir / "output-sent"
        if self.rt.outputs is None or not own.is_dir() or sent.exists():
            return True
        if self.state is WorkerRunState.FAILED_TO_START:
            return True
        a = self.assignment
        try:
            digest = upload(self.rt.outputs, a.job_id, a.worker, own)
        except OutputRefused as exc:
            log.info("output of %s not wanted: %s", self.name, exc)
            return True
        except (OutputUnavailable, OSError) as exc:
            log.info("output of %s not sent yet: %s", self.name, exc)
            return False
        sent.write_text(digest + "\n")
        return True

    # -- the outcome on disk -------------------------------------------------------------------------
    def _save_outcome(self) -> None:
        outcome = {"state": self.state.value, "exit_code": self.exit_code, "message": self.message}
        outcome["gpu_indices"] = self.gpu_indices  # type: ignore[assignment]
        outcome["ran_s"] = self.ran_s  # type: ignore[assignment]
        # durable: it is written before the container is removed, and after a power cut it is all that is
        # left of how the worker ended (its exit code is what the job's state and its bill come from)
        write_atomic(self.dir / "report.json", json.dumps(outcome).encode(), mode=0o644)

    def _load_outcome(self) -> None:
        try:
            outcome = json.loads((self.dir / "report.json").read_text())
            self.state = WorkerRunState(outcome["state"])
            self.exit_code, self.message = outcome.get("exit_code"), outcome.get("message")
            self.gpu_indices = list(outcome.get("gpu_indices") or [])
            self.ran_s = outcome.get("ran_s")
        except (OSError, ValueError, KeyError):
            return
        if self.found is None:
            self.cleaned.set()
