"""The desired-state handler for `jobs` (contracts/jobs.py): keep this node's containers in line with
desired["jobs"] and report each worker under actual["jobs"].

`minion run` calls setup(ctx) once (minion/join/run.py RUN_HOOKS). Every heartbeat answer then hands
desired["jobs"] to JobsAgent.handle, which never waits for a container: each worker lives in its own
thread (minion/jobs/worker.py) and handle() only starts, updates and reads them.

- A worker in desired and unknown here starts — unless a container of it already runs (labels
  rigbase.owner/job/worker): that one is adopted, so a restarted minion never starts a duplicate.
- `stop: true` stops it (SIGTERM, stop_grace_s, SIGKILL); a new generation stops the old container and
  starts the new one once the old is removed.
- A worker no longer in desired is stopped, and forgotten (its directory removed) once it ended and its
  output was shipped. Containers of ours that no worker in desired names are stopped and removed.
- On shutdown the threads return and the containers keep running: the next `minion run` adopts them."""

from __future__ import annotations

import logging
import secrets
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from contracts.heartbeat_keys import HeartbeatKey
from contracts.jobs import (
    USAGE_PER_REPORT,
    USAGE_REPORT_BUDGET,
    JobsActual,
    JobsDesired,
    WorkerAssignment,
    WorkerReport,
    WorkerRunState,
)
from contracts.tunnel import StreamOpen
from minion import desired
from minion.finalize.runner import read_facts
from minion.gpu.keeper import CdiKeeper
from minion.jobs.cache_agent import CacheAgent, cache_root
from minion.jobs.gpus import GpuPool
from minion.jobs.images import ImageBook
from minion.jobs.logs import ControlPlaneLogs, LogTransport
from minion.jobs.mounts import unbind_all
from minion.jobs.network import JobsNetwork, NetworkRefused, peer_ports
from minion.jobs.objects import ControlPlaneObjects, ObjectCache, ObjectSource
from minion.jobs.outputs import ControlPlaneOutputs, OutputSink
from minion.jobs.podman import LABEL_GENERATION, LABEL_JOB, LABEL_WORKER, Container, Podman, PodmanError
from minion.jobs.tunnel import NotHere, Tunnel
from minion.jobs.worker import ContainerRuntime, Worker
from minion.settings import ContainerSettings

log = logging.getLogger(__name__)

Key = tuple[str, int]


def owner_of(root: Path) -> str:
    """This minion's container label, kept in its state directory (stable across restarts)."""
    path = root / "owner"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        root.mkdir(parents=True, exist_ok=True)
        owner = secrets.token_hex(4)
        path.write_text(owner + "\n")
        return owner


def runtime_for(
    settings: ContainerSettings,
    root: Path,
    transport: LogTransport,
    objects: ObjectCache | None = None,
    outputs: OutputSink | None = None,
) -> ContainerRuntime:
    """The podman, GPUs, log transport and object cache the workers under `root` share (its own owner
    label)."""
    podman = Podman(settings)
    return ContainerRuntime(
        podman=podman,
        settings=settings,
        gpus=GpuPool(settings.cdi_spec_dirs, settings.gpu_kind),
        transport=transport,
        owner=owner_of(root),
        root=root,
        closing=threading.Event(),
        objects=objects,
        outputs=outputs,
        images=ImageBook(podman),
    )


def _key_of(container: Container) -> Key | None:
    job, worker = container.labels.get(LABEL_JOB), container.labels.get(LABEL_WORKER, "")
    return (job, int(worker)) if job and worker.isdigit() else None


@dataclass
class JobsAgent:
    rt: ContainerRuntime
    workers: dict[Key, Worker] = field(default_factory=dict)
    retiring: list[Worker] = field(default_factory=list)  # replaced generations, still ending
    found: dict[Key, Container] | None = None  # our containers at the first handle (adoption)
    lock: threading.Lock = field(default_factory=threading.Lock)
    network: JobsNetwork | None = None  # the narrowed jobs network; None where settings.network is set
    gpu_spec: CdiKeeper | None = None  # keeps the node's NVIDIA CDI spec in step with its driver

    @classmethod
    def create(
        cls,
        settings: ContainerSettings,
        state_dir: Path,
        transport: LogTransport,
        objects: ObjectSource | None = None,
        outputs: OutputSink | None = None,
        object_dir: Path | None = None,
    ) -> JobsAgent:
        """`objects`: where datasets, models and checkpoints are fetched from, into STATE/objects (or
        settings.object_dir); `outputs`: where workers' own /opt/ml/output goes when they end."""
        cache = None
        if objects is not None:
            budget = int(settings.object_cache_gb * 10**9) if settings.object_cache_gb else None
            root = object_dir or settings.object_dir or state_dir / "objects"
            cache = ObjectCache(root, objects, budget_bytes=budget)
        rt = runtime_for(settings, state_dir / "jobs", transport, cache, outputs)
        own = (
            None if settings.network else JobsNetwork(rt.podman, settings.jobs_network, settings.jobs_subnet)
        )
        agent = cls(rt, network=own)
        if cache is not None:
            cache.busy = agent.mounted_objects
        return agent

    def dial(self, opening: StreamOpen) -> tuple[str, int]:
        """Where the tunnel takes a stream: the port of that worker's container, while it runs here;
        nothing else on the node (NotHere)."""
        with self.lock:
            worker = self.workers.get((opening.job_id, opening.worker))
        address = (
            worker.serving_address() if worker is not None and not worker.stop_requested.is_set() else None
        )
        if worker is None or address is None:
            raise NotHere(f"worker {opening.worker} of job {opening.job_id} does not run on this node")
        worker.touched()
        return address, opening.port

    def mounted_objects(self) -> set[str]:
        """The digests a worker known here mounts (running, starting, or ended and not yet forgotten):
        never evicted from under it."""
        with self.lock:
            workers = [*self.workers.values(), *self.retiring]
        return {m.digest for w in workers for m in w.assignment.mounts if m.digest is not None}

    # -- the handler -----------------------------------------------------------------------------------
    def handle(self, value: Any) -> dict[str, Any]:
        try:
            wanted = JobsDesired.model_validate(value)
        except ValidationError as exc:
            return self.actual(f"unreadable jobs: {exc.error_count()} problem(s); nothing changed")
        missing = self.rt.podman.missing()
        if missing:  # no retry helps: the workers fail, and the message says what to install
            return self.actual(missing, wanted.workers, WorkerRunState.FAILED_TO_START)
        if self.gpu_spec is not None:
            self.gpu_spec.refresh()  # a new driver or GPU is in the spec before a worker asks for it
        if self.network is not None and wanted.workers:
            try:  # before any container starts on it; a no-op while the region's policy stays the same
                live = [p for w in wanted.workers if not w.stop for p in w.peers]
                self.network.ensure(wanted.network, peer_ports(live))
            except NetworkRefused as exc:  # nothing starts unnarrowed; the next beat tries again
                return self.actual(str(exc))
        with self.lock:
            if self.found is None:
                try:
                    self.found = {k: c for c in self.rt.podman.owned(self.rt.owner) if (k := _key_of(c))}
                except PodmanError as exc:
                    return self.actual(f"cannot list this node's containers: {exc}", wanted.workers)
            self._converge(wanted)
        return self.actual(None)

    def _converge(self, wanted: JobsDesired) -> None:
        access = {d.name: d for d in wanted.datastores}
        assert self.found is not None
        listed = {a.key: a for a in wanted.workers}
        for key, assignment in listed.items():
            current = self.workers.get(key)
            if current is None:
                self._start(assignment, access, self.found.pop(key, None))
            elif current.assignment.generation != assignment.generation:
                current.stop_requested.set()  # the new attempt starts once the old container is gone
                if current.cleaned.is_set():
                    self.retiring.append(self.workers.pop(key))
                    self._start(assignment, access, None)
            else:
                current.update(assignment, access)
        for key, worker in list(self.workers.items()):
            if key not in listed:
                worker.stop_requested.set()
                if worker.finished:
                    self._forget(self.workers.pop(key))
        for worker in [w for w in self.retiring if w.finished]:
            self.retiring.remove(worker)
            self._forget(worker)
        for key in [k for k in self.found if k not in listed]:  # ours, but no worker wants it: remove
            self._remove_stray(self.found.pop(key))

    def _start(self, assignment: WorkerAssignment, access: dict[str, Any], found: Container | None) -> None:
        if found is not None and found.labels.get(LABEL_GENERATION) != assignment.generation:
            self._remove_stray(found)  # an older attempt of this worker: never adopted
            found = None
        worker = Worker(self.rt, assignment, access, found)
        self.workers[assignment.key] = worker
        worker.thread.start()

    def _remove_stray(self, container: Container) -> None:
        def remove() -> None:
            try:
                self.rt.podman.stop(container.name, 10)
                self.rt.podman.remove(container.name)
            except PodmanError as exc:
                log.warning("removing stray container %s: %s", container.name, exc)

        # synchronous: a worker of the same name may start right after (container names are per worker)
        remove()

    def _forget(self, worker: Worker) -> None:
        unbind_all(worker.dir)
        mounts = worker.dir / "mounts"
        if not mounts.exists() or not any(mounts.iterdir()):  # never rmtree over a live bind mount
            shutil.rmtree(worker.dir, ignore_errors=True)

    def actual(
        self,
        message: str | None,
        refused: list[WorkerAssignment] | None = None,
        state: WorkerRunState = WorkerRunState.STARTING,
    ) -> dict[str, Any]:
        """The reports of every worker known here; `refused` ones (nothing could start) get `state`."""
        with self.lock:
            workers = list(self.workers.values())
        # the report stays within its bound however many workers run: fewer samples each
        samples = min(USAGE_PER_REPORT, USAGE_REPORT_BUDGET // max(1, len(workers)))
        reports = [w.report(samples) for w in workers]
        known = {(r.job_id, r.worker) for r in reports}
        for a in refused or []:
            if a.key not in known:
                reports.append(
                    WorkerReport(
                        job_id=a.job_id,
                        worker=a.worker,
                        generation=a.generation,
                        state=state,
                        message=message[:1000] if message else None,
                    )
                )
        images = self.rt.images.report() if self.rt.images and self.rt.podman.missing() is None else None
        return JobsActual(
            workers=reports, message=message[:1000] if message else None, images=images
        ).model_dump(mode="json")

    def close(self, wait_s: float = 5.0) -> None:
        """Let the threads return; the containers keep running for the next minion to adopt."""
        self.rt.closing.set()
        for worker in [*self.workers.values(), *self.retiring]:
            worker.thread.join(wait_s)


def setup(ctx: Any) -> None:
    """Register the `jobs` handler for this `minion run` (ctx: minion.join.run.RunContext)."""
    from minion.join.client import ControlPlane

    cp = ControlPlane(ctx.enrollment)
    settings = getattr(ctx, "jobs", None) or ContainerSettings()
    agent = JobsAgent.create(
        settings,
        ctx.state.path,
        ControlPlaneLogs(cp, lambda: ctx.node),
        ControlPlaneObjects(cp, lambda: ctx.node),
        ControlPlaneOutputs(cp, lambda: ctx.node),
    )
    agent.gpu_spec = getattr(ctx, "gpu_spec", None)  # minion.gpu.agent keeps it (it runs first)
    agent.rt.gpus.why_none = lambda: agent.gpu_spec.note if agent.gpu_spec else None
    desired.register(HeartbeatKey.JOBS, agent.handle)
    tunnel = Tunnel(ctx.enrollment.control_plane_url, lambda: ctx.node, agent.dial, cp.ssl_context())
    tunnel.start()
    desired.on_shutdown(tunnel.close)
    if agent.rt.objects is not None:
        host_root = getattr(ctx, "host_root", None)
        caching = CacheAgent(
            agent.rt.objects,
            # read again each beat: a node's first finalize moves its cache onto the data cache volume
            root_of=lambda: cache_root(settings, ctx.state.path, read_facts(host_root).get("storage")),
        )
        desired.register(HeartbeatKey.OBJECTS, caching.handle)
        desired.on_shutdown(caching.close)
    desired.on_shutdown(cp.close)
    desired.on_shutdown(agent.close)
