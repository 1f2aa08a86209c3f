"""The desired-state handler for `device_config` (contracts/device.py): run the device's inference container
with the jobs' podman runner (minion/jobs/worker.py) and report it under actual["device_config"].

One container at a time, named like a job worker (job id DEVICE_JOB, worker 0). Its generation is the
deploy's plus the boot it started in (BOOT_ID_PATH), which gives the product rules' rule without a restart
policy: after a reboot the generation is new, so the container starts again; when its command exits in
the same boot the generation is the same and the worker's saved outcome (`exited`, its code) stands, so
it is not restarted until the next deploy. A restarted minion adopts a container that still runs.

What the container gets (docs/devices.md): the configuration's image, command, env and keys; the
accelerator (CDI name, `nvidia.com/gpu=all` on L4T) and every /dev/video* and /dev/media* device; the
model and checkpoints from the region cache, read-only; the datastore path at the output path, named by
TRAINML_OUTPUT_PATH and RIGBASE_OUTPUT_PATH; all of the device's CPUs and memory."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from pydantic import ValidationError

from contracts.device import (
    CHECKPOINTS_PATH,
    DEVICE_LOG_ROUTE,
    INFERENCE_OF_RUN_STATE,
    LAST_LINES,
    LAST_LINES_MAX,
    MODEL_PATH,
    OUTPUT_PATH_ENV,
    DeviceActual,
    DeviceDesired,
    DeviceInference,
    InferenceReport,
    InferenceState,
)
from contracts.heartbeat_keys import HeartbeatKey
from contracts.jobs import ENDED, OUTPUT_PATH, LogAck, LogChunk, WorkerAssignment
from contracts.object_cache import CacheRole
from minion import desired
from minion.finalize.runner import read_facts
from minion.jobs.agent import runtime_for
from minion.jobs.cache_agent import cache_root
from minion.jobs.logs import ControlPlaneLogs, entry_bytes, post_chunk
from minion.jobs.mounts import unbind_all
from minion.jobs.objects import ControlPlaneObjects, ObjectCache
from minion.jobs.podman import LABEL_GENERATION, LABEL_JOB, Container, PodmanError
from minion.jobs.worker import ContainerRuntime, Worker
from minion.join.client import ControlPlane
from minion.settings import ContainerSettings

log = logging.getLogger(__name__)

DEVICE_JOB: Final = "device-inference"  # the job id of the inference container (its name and labels)
BOOT_ID_PATH: Final = Path("/proc/sys/kernel/random/boot_id")
ACCELERATOR: Final = "nvidia.com/gpu=all"  # the L4T GPU by CDI name (nvidia-ctk cdi generate --mode=csv)
TAIL_BYTES: Final = 64 * 1024  # of the k8s-file log read for the last lines


def media_devices(dev: Path = Path("/dev")) -> list[str]:
    """Every camera/codec (/dev/video*) and media controller (/dev/media*) of the device."""
    try:
        names = sorted(p.name for p in dev.iterdir() if p.name.startswith(("video", "media")))
    except OSError:
        return []
    return [str(dev / name) for name in names]


def memory_mb(meminfo: Path = Path("/proc/meminfo")) -> int:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return max(int(line.split()[1]) // 1024, 16)
    except (OSError, ValueError, IndexError):
        pass
    return 1024


def last_lines(log_path: Path) -> str | None:
    """The last LAST_LINES lines of a container's output (its k8s-file log), at most LAST_LINES_MAX bytes."""
    try:
        with log_path.open("rb") as f:
            start = max(f.seek(0, os.SEEK_END) - TAIL_BYTES, 0)
            f.seek(start)
            entries = f.read().splitlines(keepends=True)
    except OSError:
        return None
    if start:  # the first entry read is cut
        entries = entries[1:]
    text = b"".join(entry_bytes(entry) for entry in entries)
    lines = text.decode(errors="replace").splitlines()[-LAST_LINES:]
    out = "\n".join(lines).encode()[-LAST_LINES_MAX:].decode(errors="ignore")
    return out or None


@dataclass
class DeviceLogs(ControlPlaneLogs):
    """The inference container's output over the minion's own outbound connection (node credential)."""

    def send(self, job_id: str, worker: int, chunk: LogChunk) -> LogAck | None:
        node = self.node()
        path = DEVICE_LOG_ROUTE.format(node_id=node["node_id"])
        return post_chunk(self.cp, path, node["node_credential"], chunk)


@dataclass
class DeviceAgent:
    rt: ContainerRuntime
    boot_id: Callable[[], str]
    accelerator: str | None = ACCELERATOR
    devices: Callable[[], list[str]] = media_devices
    worker: Worker | None = None
    retiring: list[Worker] = field(default_factory=list)
    found: dict[str, Container] | None = None  # our containers at the first handle, by generation
    lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def create(
        cls,
        settings: ContainerSettings,
        state_dir: Path,
        transport: Any,
        *,
        boot_id_path: Path = BOOT_ID_PATH,
        accelerator: str | None = ACCELERATOR,
        devices: Callable[[], list[str]] = media_devices,
        objects: ObjectCache | None = None,
    ) -> DeviceAgent:
        """`objects`: the region's cache as the device sees it (a `shared` one: it fetches nothing), for
        a configuration's public models and checkpoints."""
        rt = runtime_for(settings, state_dir / "device", transport, objects)

        def boot_id() -> str:
            try:
                return boot_id_path.read_text().strip().replace("-", "")[:12] or "0"
            except OSError:
                return "0"

        return cls(rt, boot_id, accelerator, devices)

    def assignment(self, inf: DeviceInference) -> WorkerAssignment:
        env = dict(inf.env)
        env.update(dict.fromkeys(OUTPUT_PATH_ENV, OUTPUT_PATH))
        env.update(TRAINML_MODEL_PATH=MODEL_PATH, TRAINML_CHECKPOINT_PATH=CHECKPOINTS_PATH)
        devices = ([self.accelerator] if self.accelerator else []) + self.devices()
        return WorkerAssignment(
            job_id=DEVICE_JOB,
            job_name=inf.config,
            worker=0,
            generation=f"{inf.generation}.b{self.boot_id()}",
            image=inf.image,
            command=inf.command,
            env=env,
            cpus=float(os.cpu_count() or 1),
            memory_mb=memory_mb(),
            mounts=inf.mounts,
            devices=devices,
            stop_grace_s=10,
        )

    # -- the handler -----------------------------------------------------------------------------------
    def handle(self, value: Any) -> dict[str, Any] | None:
        if value is None:  # not a device: the control plane sends this key to devices only
            return None
        try:
            wanted = DeviceDesired.model_validate(value)
            inf = wanted.inference
            assignment = self.assignment(inf) if inf is not None else None
        except ValidationError as exc:
            return DeviceActual(
                message=f"unreadable configuration: {exc.error_count()} problem(s)"
            ).model_dump()
        with self.lock:
            missing = self.rt.podman.missing()
            if missing and assignment is not None:
                return self._refused(assignment, missing)
            if self.found is None and not missing:
                try:
                    owned = self.rt.podman.owned(self.rt.owner)
                except PodmanError as exc:
                    if assignment is not None:
                        return self._refused(assignment, f"cannot list this device's containers: {exc}")
                    owned = []
                self.found = {c.labels.get(LABEL_GENERATION, ""): c for c in owned if c.labels.get(LABEL_JOB)}
            self._converge(assignment, {d.name: d for d in inf.datastores} if inf else {})
            return self.actual()

    def _refused(self, a: WorkerAssignment, why: str) -> dict[str, Any]:
        report = InferenceReport(generation=a.generation, state=InferenceState.FAILED, message=why[:1000])
        return DeviceActual(inference=report, message=why[:1000]).model_dump(mode="json")

    def _converge(self, a: WorkerAssignment | None, access: dict[str, Any]) -> None:
        current = self.worker
        if current is not None and (a is None or current.assignment.generation != a.generation):
            current.stop_requested.set()  # the new container starts once the old one is removed
            if current.cleaned.is_set() or current.finished:
                self.retiring.append(current)
                self.worker = current = None
        if a is not None and current is None:
            found = (self.found or {}).pop(a.generation, None)
            for stray in list((self.found or {}).values()):  # older deploys or boots: never adopted
                self._remove(stray)
            self.found = {}
            self.worker = Worker(self.rt, a, access, found)
            self.worker.thread.start()
        elif a is not None and current is not None and current.assignment.generation == a.generation:
            current.update(a, access)
        elif a is None and self.found:  # no configuration: a container left from before goes too
            for stray in self.found.values():
                self._remove(stray)
            self.found = {}
        for worker in [w for w in self.retiring if w.finished]:
            self.retiring.remove(worker)
            unbind_all(worker.dir)

    def _remove(self, container: Container) -> None:
        try:
            self.rt.podman.stop(container.name, 10)
            self.rt.podman.remove(container.name)
        except PodmanError as exc:
            log.warning("removing stray container %s: %s", container.name, exc)

    def actual(self) -> dict[str, Any]:
        worker = self.worker
        if worker is None:
            return DeviceActual().model_dump(mode="json")
        r = worker.report()
        state = INFERENCE_OF_RUN_STATE[r.state]
        lines = last_lines(worker.dir / "output.log") if r.state in ENDED else None
        message = r.message
        if state is InferenceState.EXITED and message is None:
            message = f"exited with code {r.exit_code}: not restarted until the next deploy or reboot"
        report = InferenceReport(
            generation=r.generation,
            state=state,
            exit_code=r.exit_code,
            message=message[:1000] if message else None,
            last_lines=lines,
            log_acked=r.log_acked,
        )
        return DeviceActual(inference=report).model_dump(mode="json")

    def close(self, wait_s: float = 5.0) -> None:
        """Let the thread return; the container keeps running for the next minion to adopt."""
        self.rt.closing.set()
        for worker in [w for w in (self.worker, *self.retiring) if w is not None]:
            worker.thread.join(wait_s)


def setup(ctx: Any) -> None:
    """Register the `device_config` handler for this `minion run` (ctx: minion.join.run.RunContext)."""
    cp = ControlPlane(ctx.enrollment)
    settings = getattr(ctx, "jobs", None) or ContainerSettings()
    transport = DeviceLogs(cp, lambda: ctx.node)
    storage = read_facts(getattr(ctx, "host_root", None)).get("storage")
    cache = ObjectCache(
        cache_root(settings, ctx.state.path, storage),
        ControlPlaneObjects(cp, lambda: ctx.node),
        role=CacheRole.SHARED,
    )
    agent = DeviceAgent.create(settings, ctx.state.path, transport, objects=cache)
    desired.register(HeartbeatKey.DEVICE_CONFIG, agent.handle)
    desired.on_shutdown(cp.close)
    desired.on_shutdown(agent.close)
