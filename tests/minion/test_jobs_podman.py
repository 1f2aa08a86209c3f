"""Job workers as real rootful podman containers, driven through the jobs agent's desired-state handler.

No registry is reachable: the image is imported from a tiny root file system made of this machine's own
/bin/sh, sleep and cat with their libraries. GPUs are a generated CDI spec whose "GPUs" are /dev/null and
/dev/zero (no real GPU here), under a kind of the test's own so nothing else on the machine sees them.
Logs go to a real HTTP server on loopback that speaks LogChunk/LogAck the way the control plane does
(stores by offset, idempotently), through the minion's own ControlPlane client. This machine's container
workarounds (runc, cgroupfs, lowered ulimits: cgroups v1 and no CAP_SYS_RESOURCE) are settings here."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import stat
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Generic, TypeVar

import pytest

from contracts.jobs import (
    JobNetwork,
    JobsActual,
    JobsDesired,
    LogAck,
    LogChunk,
    Mount,
    ServeBinding,
    UserNamespace,
    WorkerAssignment,
    WorkerUsage,
)
from contracts.tunnel import StreamOpen
from minion.jobs.agent import JobsAgent
from minion.jobs.container import RunPlan
from minion.jobs.logs import ControlPlaneLogs
from minion.jobs.network import JobsNetwork
from minion.jobs.podman import LABEL_JOB, Podman
from minion.jobs.tunnel import NotHere
from minion.join.client import ControlPlane, Enrollment
from minion.settings import ContainerSettings

IMAGE = "localhost/rigbase-jobs-test:1"
TOOLS = ("sh", "sleep", "cat", "id", "chmod", "bash", "timeout", "socat")
RUNTIME = {  # this machine kind: cgroups v1, no CAP_SYS_RESOURCE (docs/minion-jobs.md, "Settings")
    "oci_runtime": "runc",
    "cgroup_manager": "cgroupfs",
    "ulimits": ("nofile=1024:1024", "nproc=4096:4096"),
}


# ---- the image and the CDI spec ---------------------------------------------------------------------
def _libraries(binary: str) -> list[str]:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    return re.findall(r"(/\S+)", out)


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if shutil.which("podman") is None:
        pytest.skip(
            "podman is not installed: apt-get install -y podman runc catatonit (scripts/install-deps.sh)"
        )
    if os.geteuid() != 0:
        pytest.skip("job containers are rootful podman: run the tests as root")
    files: dict[str, str] = {}  # path in the image → the host file (each library once)
    for tool in TOOLS:
        binary = shutil.which(tool)
        assert binary, tool
        files[f"bin/{tool}"] = os.path.realpath(binary)
        files.update({lib.lstrip("/"): os.path.realpath(lib) for lib in _libraries(binary)})
    archive = tmp_path_factory.mktemp("image") / "rootfs.tar"
    with tarfile.open(archive, "w") as tar:
        for directory in ("tmp", "proc", "sys", "dev", "etc", "opt", "opt/ml"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if directory == "tmp" else 0o755
            tar.addfile(info)
        for arcname, source in files.items():
            tar.add(source, arcname=arcname)
    with archive.open("rb") as data:
        made = subprocess.run(["podman", "import", "-", IMAGE], stdin=data, capture_output=True, check=True)
    yield IMAGE
    image_id = made.stdout.decode().strip()  # by id: removing the name alone would leave the layer behind
    subprocess.run(["podman", "rmi", "--force", image_id], capture_output=True, check=False)


@pytest.fixture(scope="module")
def gpu_kind() -> Iterator[str]:
    """podman 4.3 reads CDI specs only from /etc/cdi and /var/run/cdi: a spec file of our own there, for
    two character devices of our own on the host (null and zero's numbers). Its paths are the host's, as
    NVIDIA's are: in a user namespace runc cannot make device nodes and binds the host's path instead."""
    tag = secrets.token_hex(3)
    kind = f"jobs-test-{tag}.rigbase.dev/gpu"
    nodes = [Path(f"/dev/rigbase-{tag}-gpu{index}") for index in (0, 1)]  # each module's own
    for node, minor in zip(nodes, (3, 5), strict=True):
        node.unlink(missing_ok=True)
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
        node.chmod(0o666)
    devices = [
        {
            "name": str(index),
            "containerEdits": {
                "env": [f"RIGBASE_TEST_GPU={index}", f"RIGBASE_TEST_GPU_DEV={node}"],
                "deviceNodes": [{"path": str(node), "hostPath": str(node)}],
            },
        }
        for index, node in enumerate(nodes)
    ]
    spec = Path("/etc/cdi") / f"rigbase-jobs-test-{tag}.json"
    spec.parent.mkdir(exist_ok=True)
    spec.write_text(json.dumps({"cdiVersion": "0.5.0", "kind": kind, "devices": devices}))
    yield kind
    spec.unlink()
    for node in nodes:
        node.unlink(missing_ok=True)


def jobs_network_named(name: str, subnet: str) -> Iterator[tuple[str, str]]:
    """The narrowed jobs network customers' workers get (minion/jobs/network.py): each test module names
    its own, so that test streams running side by side never share one; removed at the end."""
    yield name, subnet
    JobsNetwork(Podman(ContainerSettings(**RUNTIME)), name, subnet).remove()  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def jobs_network() -> Iterator[tuple[str, str]]:
    yield from jobs_network_named("rigbase-jt-podman", "10.231.1.0/24")


@pytest.fixture
def settings(tmp_path: Path, gpu_kind: str, jobs_network: tuple[str, str]) -> ContainerSettings:
    (tmp_path / "cache").mkdir()
    return ContainerSettings(
        **RUNTIME,  # type: ignore[arg-type]
        jobs_network=jobs_network[0],
        jobs_subnet=jobs_network[1],
        cdi_spec_dirs=(Path("/etc/cdi"),),
        gpu_kind=gpu_kind,
        cache_dir=tmp_path / "cache",
        datastore_dir=tmp_path / "datastores",
        usage_sample_s=1.0,  # every running worker here is sampled, ten times as often as on a node
    )


# ---- a receiver that speaks the log contract -------------------------------------------------------
K = TypeVar("K", bound=Hashable)


class KeyedLogStore(Generic[K]):
    """The control plane's side: output per key (a job's worker, a device's generation), stored by offset,
    idempotent."""

    def __init__(self) -> None:
        self.data: dict[K, bytearray] = {}
        self.eof: set[K] = set()
        self.chunks = 0
        self.lock = threading.Lock()

    def take(self, key: K, chunk: LogChunk) -> LogAck:
        with self.lock:
            held = self.data.setdefault(key, bytearray())
            data = chunk.data.encode()
            if chunk.offset <= len(held):  # overlapping resends store nothing twice
                held += data[len(held) - chunk.offset :]
            if chunk.eof and chunk.offset == len(held):
                self.eof.add(key)
            self.chunks += 1
            return LogAck(acked=len(held), eof=key in self.eof)

    def output(self, key: K) -> str:
        with self.lock:
            return bytes(self.data.get(key, b"")).decode()


class LogStore(KeyedLogStore[tuple[str, int]]):
    """Output per (job, worker)."""

    def text(self, job: str, worker: int = 0) -> str:
        return self.output((job, worker))

    def posted(self, match: re.Match[str], chunk: LogChunk) -> LogAck:
        return self.take((match[1], int(match[2])), chunk)


ROUTE = re.compile(r"^/v1/nodes/node-1/jobs/([^/]+)/workers/(\d+)/logs$")
Take = Callable[[re.Match[str], LogChunk], LogAck]  # stores a chunk posted to the route (it names whose)


class LogServer:
    """A real HTTP server on loopback that answers the node's log route (node-1, credential cred-1)."""

    def __init__(self, take: Take, port: int = 0, route: re.Pattern[str] = ROUTE) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                match = route.match(self.path)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if not match or self.headers.get("Authorization") != "Bearer cred-1":
                    self.send_response(404)
                    self.end_headers()
                    return
                payload = take(match, LogChunk.model_validate_json(body)).model_dump_json().encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.allow_reuse_address = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def store() -> LogStore:
    return LogStore()


@pytest.fixture
def server(store: LogStore) -> Iterator[LogServer]:
    running = LogServer(store.posted)
    yield running
    running.close()


Agents = Callable[[], JobsAgent]


@pytest.fixture
def agents(settings: ContainerSettings, server: LogServer, tmp_path: Path) -> Iterator[Agents]:
    """Makes agents on one state directory (a restarted minion is a second one); closes and cleans up."""
    made: list[JobsAgent] = []
    cp = ControlPlane(Enrollment(f"http://127.0.0.1:{server.port}", None), timeout=5.0)
    node = {"node_id": "node-1", "node_credential": "cred-1"}

    def make() -> JobsAgent:
        agent = JobsAgent.create(settings, tmp_path / "state", ControlPlaneLogs(cp, lambda: node))
        made.append(agent)
        return agent

    yield make
    for agent in made:
        agent.close(wait_s=2)
    owner = made[0].rt.owner if made else None
    if owner:
        podman = Podman(settings)
        for container in podman.owned(owner):
            podman.remove(container.name)
    cp.close()


ACCOUNT_A, ACCOUNT_B = UserNamespace.of_slot(1), UserNamespace.of_slot(2)


def worker(job: str, command: str, n: int = 0, **fields: Any) -> WorkerAssignment:
    """A customer's worker, as the control plane sends it: in account A's user namespace unless told."""
    values: dict[str, Any] = {
        "cpus": 0.5,
        "memory_mb": 64,
        "stop_grace_s": 10,
        "userns": ACCOUNT_A,
        "image": IMAGE,
    } | fields
    return WorkerAssignment(
        job_id=job, job_name=f"{job}-name", worker=n, generation="g1", command=command, **values
    )


def until(
    agent: JobsAgent,
    workers: list[WorkerAssignment],
    done: Callable[[JobsActual], bool],
    timeout: float = 20,
    network: JobNetwork | None = None,
) -> JobsActual:
    """Heartbeat the agent (every 0.3 s, as the run loop would, only faster) until `done`."""
    desired = JobsDesired(workers=workers, network=network or JobNetwork()).model_dump(mode="json")
    deadline = time.monotonic() + timeout
    while True:
        actual = JobsActual.model_validate(agent.handle(desired))
        if done(actual):
            return actual
        assert time.monotonic() < deadline, f"timed out; last actual: {actual.model_dump()}"
        time.sleep(0.3)


def ended_and_shipped(actual: JobsActual) -> bool:
    return all(w.state in ("exited", "stopped", "failed_to_start") and w.log_eof for w in actual.workers)


# ---- the tests ---------------------------------------------------------------------------------------
def test_a_worker_that_exits_0_with_its_limits_env_gpu_and_output_mount(
    image: str, agents: Agents, store: LogStore, settings: ContainerSettings, tmp_path: Path
) -> None:
    # a datastore root as an operator (or mount_root) mounted it on the node: a real bind mount
    share, staging = tmp_path / "share", settings.datastore_dir / "results"
    (share / "runs" / "r1").mkdir(parents=True)
    staging.mkdir(parents=True)
    subprocess.run(["mount", "--bind", str(share), str(staging)], check=True)
    try:
        command = (
            'echo "name=$RIGBASE_JOB_NAME worker=$RIGBASE_WORKER out=$RIGBASE_OUTPUT_PATH '
            'gpu=$RIGBASE_TEST_GPU indices=$RIGBASE_GPU_INDICES secret=$TOKEN"; '
            "cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/memory.max 2>/dev/null; "
            "cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/cpu.max 2>/dev/null; "
            'echo "nofile=$(ulimit -n)"; [ -c "$RIGBASE_TEST_GPU_DEV" ] && echo has-gpu0; '
            'echo result > "$RIGBASE_OUTPUT_PATH/result.txt"'
        )
        a = worker(
            "job-ok",
            command,
            gpu_count=1,
            env={"TOKEN": "s3cret"},
            mounts=[
                Mount(source_kind="datastore", datastore="results", path="/runs/r1", target="/opt/ml/output")
            ],
        )
        agent = agents()
        actual = until(agent, [a], ended_and_shipped)
        report = actual.workers[0]
        assert (report.state, report.exit_code, report.gpu_indices) == ("exited", 0, [0]), report.message
        out = store.text("job-ok")
        assert "name=job-ok-name worker=0 out=/opt/ml/output gpu=0 indices=0 secret=s3cret" in out
        assert "67108864" in out or "\n67108864\n" in out  # 64 MiB (cgroups v1) …
        assert "50000" in out  # … and half a CPU: a 50 ms quota per 100 ms period
        assert "nofile=1024" in out and "has-gpu0" in out
        assert (share / "runs" / "r1" / "result.txt").read_text() == "result\n"
        assert not Podman(settings).owned(agent.rt.owner), "the ended container was removed"
    finally:
        subprocess.run(["umount", "--lazy", str(staging)], check=False)


def test_an_ended_workers_report_says_how_long_its_container_ran(image: str, agents: Agents) -> None:
    """Billing of a worker that began and ended between two beats comes from this (services/jobs): the
    container's own start and finish, from podman, survive in the report once it ended."""
    agent = agents()
    actual = until(agent, [worker("job-short", "sleep 2")], ended_and_shipped)
    (report,) = actual.workers
    assert report.state == "exited" and report.ran_s is not None
    # it slept 2 s; podman's start and finish stamps come from two clocks' reads around the process
    # (a red run measured 1.99997 s), so the bound allows a tenth of a second
    assert 1.9 <= report.ran_s < 30, report.ran_s


def test_a_job_runs_with_capabilities_dropped_and_no_new_privileges(
    image: str, agents: Agents, store: LogStore
) -> None:
    """Tenancy finding 6: containers ran with podman's default capabilities and could gain privileges
    through setuid binaries (docs/minion-jobs.md, "What a job can and cannot reach")."""
    agent = agents()
    a = worker("job-caps", "cat /proc/self/status")
    until(agent, [a], ended_and_shipped)
    status = dict(line.split(":", 1) for line in store.text("job-caps").splitlines() if ":" in line)
    kept = int(status["CapEff"].strip(), 16)
    # CHOWN 0, DAC_OVERRIDE 1, FOWNER 3, KILL 5, SETGID 6, SETUID 7: nothing else (no NET_RAW, SYS_CHROOT…)
    assert kept == sum(1 << bit for bit in (0, 1, 3, 5, 6, 7)), hex(kept)
    assert status["NoNewPrivs"].strip() == "1"
    assert status["Seccomp"].strip() == "2", "podman's default seccomp profile is on"


def test_each_accounts_jobs_run_in_its_own_user_namespace_and_keep_to_their_own_files(
    image: str, agents: Agents, store: LogStore, settings: ContainerSettings, tmp_path: Path
) -> None:
    """Tenancy finding 6: containers ran as the node's uid 0. Now a job's root is its account's host range:
    its output on the datastore is that range's, another account's job can neither read nor change it,
    and a file only the node's root may read stays closed to every job."""
    share, staging = tmp_path / "share", settings.datastore_dir / "shared"
    for run in ("a", "b"):
        (share / run).mkdir(parents=True)
    (share / "node-only").write_text("the node's own\n")
    (share / "node-only").chmod(0o600)
    staging.mkdir(parents=True)
    subprocess.run(["mount", "--bind", str(share), str(staging)], check=True)
    try:

        def output_to(run: str) -> list[Mount]:
            return [
                Mount(source_kind="datastore", datastore="shared", path=f"/{run}", target="/opt/ml/output")
            ]

        agent = agents()
        first = worker(
            "job-a",
            "cat /proc/self/uid_map; id -u; "
            "echo mine > /opt/ml/output/model.bin; chmod 600 /opt/ml/output/model.bin",
            mounts=output_to("a"),
        )
        until(agent, [first], ended_and_shipped)
        a_out = store.text("job-a")
        assert re.search(rf"^\s*0\s+{ACCOUNT_A.first}\s+{ACCOUNT_A.size}$", a_out, re.M), a_out
        assert "\n0\n" in f"\n{a_out}", "the job is root inside its namespace"
        held = (share / "a" / "model.bin").stat()
        assert (held.st_uid, held.st_gid) == (ACCOUNT_A.first, ACCOUNT_A.first)
        assert (share / "a").stat().st_uid == ACCOUNT_A.first, "the output directory became the job's"

        # account B's job, given A's output and the node's file (reaching them as a shared datastore would)
        reach = [
            Mount(source_kind="datastore", datastore="shared", path="/", target="/data", read_only=False),
            *output_to("b"),
        ]
        probe = (
            "cat /data/a/model.bin || echo read-refused; echo x > /data/a/model.bin || echo write-refused; "
            "cat /data/node-only || echo node-file-refused; "
            "echo theirs > /opt/ml/output/out.txt && echo wrote"
        )
        until(agent, [worker("job-b", probe, mounts=reach, userns=ACCOUNT_B)], ended_and_shipped)
        b_out = store.text("job-b")
        assert "read-refused" in b_out and "write-refused" in b_out and "node-file-refused" in b_out, b_out
        assert "mine" not in b_out and "the node's own" not in b_out
        assert "wrote" in b_out and (share / "b" / "out.txt").stat().st_uid == ACCOUNT_B.first
        assert (share / "a" / "model.bin").read_text() == "mine\n"
    finally:
        subprocess.run(["umount", "--lazy", str(staging)], check=False)


def test_a_busy_workers_usage_shows_its_cpu_quota_and_its_disk_growing_as_it_writes(
    image: str, agents: Agents
) -> None:
    # 8 MiB to its container disk each second for four seconds, then a busy loop under half a CPU
    command = (
        'x=$(printf "%*s" 1048575 ""); for s in 1 2 3 4; do for i in 1 2 3 4 5 6 7 8; do '
        'echo "$x" >> /tmp/fill; done; sleep 1; done; while :; do :; done'
    )
    a = worker("job-busy", f"bash -c '{command}'", cpus=0.5)
    agent = agents()
    seen: dict[float, WorkerUsage] = {}

    def sampled(actual: JobsActual) -> bool:
        seen.update({u.at: u for w in actual.workers for u in w.usage})
        busy = [u for u in seen.values() if u.disk_bytes >= 32 * 2**20]
        return len(busy) >= 3

    until(agent, [a], sampled, timeout=40)
    samples = [seen[at] for at in sorted(seen)]
    disks = [u.disk_bytes for u in samples]
    assert disks == sorted(disks) and disks[-1] - disks[0] >= 8 * 2**20, disks  # it grew as it wrote
    assert disks[-1] >= 32 * 2**20
    busy = samples[-1].cpu_cores
    assert 0.3 <= busy <= 0.6, [u.cpu_cores for u in samples]  # near its --cpus 0.5, never past it
    assert samples[-1].memory_bytes > 0 and samples[-1].net_rx_bytes >= 0


def test_the_watched_quota_counts_what_a_worker_writes_to_its_own_output(
    image: str, agents: Agents, monkeypatch: pytest.MonkeyPatch
) -> None:
    """disk_gb 1, and 1.25 GiB written to /opt/ml/output (the worker's own directory on the node, not the
    container's layer): stopped, with the quota's reason, and what it wrote is in its usage."""
    monkeypatch.setattr("minion.jobs.worker.DISK_CHECK_S", 1.0)
    command = (
        'x=$(printf "%*s" 1048575 ""); for i in $(seq 1280 2>/dev/null || echo {1..1280}); do '
        'echo "$x" >> "$RIGBASE_OUTPUT_PATH/fill"; done; echo filled; sleep 600'
    )
    a = worker("job-fills", f"bash -c '{command}'", disk_gb=1, stop_grace_s=1)
    agent = agents()
    actual = until(agent, [a], ended_and_shipped, timeout=90)
    w = actual.workers[0]
    assert w.state == "exited" and w.exit_code in (137, 143), w  # stopped: SIGTERM, or SIGKILL after grace
    assert "to its container disk and output, over its 1 GB quota" in (w.message or ""), w.message
    assert max(u.disk_bytes for u in w.usage) > 2**30


def test_exit_3_is_reported_and_two_workers_never_share_a_gpu(image: str, agents: Agents) -> None:
    agent = agents()
    pair = [worker("job-three", "sleep 4; exit 3", n, gpu_count=1) for n in (0, 1)]
    actual = until(agent, pair, lambda a: all(w.state == "running" for w in a.workers))
    assert sorted(i for w in actual.workers for i in w.gpu_indices) == [0, 1]
    # a third worker wanting a GPU while both are held does not start: no GPU is handed out twice
    third = worker("job-more", "exit 0", gpu_count=1)
    actual = until(
        agent,
        [*pair, third],
        lambda a: any(w.job_id == "job-more" and w.state != "starting" for w in a.workers),
    )
    refused = next(w for w in actual.workers if w.job_id == "job-more")
    assert refused.state == "failed_to_start" and "0 of 2 free" in (refused.message or "")
    actual = until(agent, pair, ended_and_shipped)
    assert [(w.state, w.exit_code) for w in actual.workers] == [("exited", 3), ("exited", 3)]


def test_stop_mid_run_sends_sigterm_then_kills_after_the_grace(
    image: str, agents: Agents, store: LogStore
) -> None:
    agent = agents()
    polite = worker(
        "job-polite", "trap 'echo got TERM; exit 143' TERM; echo started; while :; do sleep 0.2; done"
    )
    stubborn = worker(
        "job-stubborn", "trap '' TERM; echo started; while :; do sleep 0.2; done", stop_grace_s=1
    )
    both = [polite, stubborn]
    until(agent, both, lambda a: all(w.state == "running" and w.log_acked > 0 for w in a.workers))
    stopped_at = time.monotonic()
    stop = [w.model_copy(update={"stop": True}) for w in both]
    actual = until(agent, stop, ended_and_shipped)
    assert time.monotonic() - stopped_at < 8, "neither waited for the 10 s grace"
    by_job = {w.job_id: w for w in actual.workers}
    assert (by_job["job-polite"].state, by_job["job-polite"].exit_code) == ("stopped", 143)
    assert store.text("job-polite") == "started\ngot TERM\n"
    assert (by_job["job-stubborn"].state, by_job["job-stubborn"].exit_code) == ("stopped", 137)  # SIGKILL


LINES = 6 * 800  # six bursts: about 230 KB, several chunks
NOISY = 'i=0; while [ $i -lt 6 ]; do j=0; while [ $j -lt 800 ]; do echo "line $i-$j ........................"; j=$((j+1)); done; i=$((i+1)); sleep 0.4; done'  # noqa: E501


def expected_noise() -> str:
    return "".join(f"line {i}-{j} ........................\n" for i in range(6) for j in range(800))


def test_logs_arrive_in_order_and_resume_after_the_receiver_restarts(
    image: str, agents: Agents, store: LogStore, server: LogServer
) -> None:
    agent = agents()
    job = worker("job-logs", NOISY)
    until(agent, [job], lambda a: a.workers[0].log_acked > 0)
    server.close()  # the control plane goes away mid-run …
    time.sleep(2.5)
    with store.lock:  # … and comes back having lost the tail it had acked (a restore, say)
        held = store.data[("job-logs", 0)]
        del held[len(held) // 2 :]
    again = LogServer(store.posted, server.port)
    try:
        actual = until(agent, [job], ended_and_shipped, timeout=30)
    finally:
        again.close()
    assert actual.workers[0].exit_code == 0
    assert store.text("job-logs") == expected_noise()  # every line once, in order
    assert actual.workers[0].log_acked == len(expected_noise())


def test_a_restarted_agent_adopts_the_running_container_and_resumes_its_log(
    image: str, agents: Agents, store: LogStore, settings: ContainerSettings
) -> None:
    first = agents()
    job = worker("job-adopt", f"echo begin; sleep 3; {NOISY}", gpu_count=1)  # still running after the restart
    actual = until(first, [job], lambda a: a.workers[0].log_acked > 0)
    gpus = actual.workers[0].gpu_indices
    first.close()  # the minion stops; the container runs on
    second = agents()
    actual = until(second, [job], lambda a: a.workers[0].state == "running")
    assert actual.workers[0].gpu_indices == gpus
    running = [c for c in Podman(settings).owned(second.rt.owner) if c.labels[LABEL_JOB] == "job-adopt"]
    assert len(running) == 1, "adopted, not started again"
    # the adopted worker's GPU is held: a new worker gets the other one
    other = worker("job-other", "exit 0", gpu_count=1)
    actual = until(second, [job, other], ended_and_shipped, timeout=30)
    by_job = {w.job_id: w for w in actual.workers}
    assert by_job["job-other"].gpu_indices != gpus and by_job["job-adopt"].exit_code == 0
    assert (
        store.text("job-adopt") == "begin\n" + expected_noise()
    )  # resumed from the acked offset, nothing twice


def test_a_node_without_podman_fails_its_workers_with_what_to_install(
    tmp_path: Path, store: LogStore
) -> None:
    settings = ContainerSettings(podman=str(tmp_path / "no-podman"))
    agent = JobsAgent.create(
        settings, tmp_path, ControlPlaneLogs(ControlPlane(Enrollment("http://127.0.0.1:9", None)), dict)
    )
    actual = JobsActual.model_validate(
        agent.handle(JobsDesired(workers=[worker("job-x", "true")]).model_dump())
    )
    assert actual.workers[0].state == "failed_to_start"
    assert "is not installed on this node; install podman" in (actual.message or "")


def test_the_reservation_port_is_published_while_the_worker_runs(
    image: str, agents: Agents, settings: ContainerSettings
) -> None:
    agent = agents()
    port = 20000 + secrets.randbelow(20000)
    served = worker("job-serve", "sleep 30", reservation={"port": port, "hostname": "serve-1"})
    until(agent, [served], lambda a: a.workers[0].state == "running")
    name = f"rigbase-{agent.rt.owner}-job-serve-0"
    mapping = subprocess.run([*Podman(settings).base(), "port", name], capture_output=True, text=True).stdout
    assert f"{port}/tcp -> 0.0.0.0:{port}" in mapping
    until(agent, [served.model_copy(update={"stop": True})], ended_and_shipped)


def test_a_container_in_the_nodes_own_namespace_publishes_nothing(tmp_path: Path) -> None:
    """A lab node's containers join its namespace (--network ns:…): the port is already the node's."""
    settings = ContainerSettings(network="ns:/run/netns/lab-node-1", **RUNTIME)  # type: ignore[arg-type]
    a = worker("job-ns", "true", reservation={"port": 8080, "hostname": "web"})
    plan = RunPlan("c", "owner", a, [], [], tmp_path / "log", tmp_path / "env", tmp_path / "auth.json")
    args = plan.args(settings)
    assert "--publish" not in args and args[args.index("--network") + 1] == "ns:/run/netns/lab-node-1"
    assert args[args.index("--ulimit") + 1] == "nofile=1024:1024"
    assert Podman(settings).base()[1:] == ["--runtime", "runc", "--cgroup-manager", "cgroupfs"]


def test_a_new_generation_replaces_the_old_container_and_strays_are_removed(
    image: str, agents: Agents, settings: ContainerSettings
) -> None:
    first = agents()
    old = worker("job-gen", "sleep 30")
    stray = worker("job-stray", "sleep 30")
    until(first, [old, stray], lambda a: all(w.state == "running" for w in a.workers))
    first.close()
    second = agents()  # restarted; the control plane now wants attempt g2 of job-gen and no job-stray
    new = old.model_copy(update={"generation": "g2", "command": "echo second attempt"})
    actual = until(second, [new], ended_and_shipped)
    assert [(w.job_id, w.generation, w.state, w.exit_code) for w in actual.workers] == [
        ("job-gen", "g2", "exited", 0)
    ]
    assert Podman(settings).owned(second.rt.owner) == [], "the old attempt and the stray are gone"
    # the same agent, a running attempt replaced: stopped and removed first, then the new one starts
    third = old.model_copy(update={"generation": "g3"})
    until(second, [third], lambda a: a.workers[0].state == "running")
    fourth = old.model_copy(update={"generation": "g4", "command": "echo fourth"})
    actual = until(second, [fourth], lambda a: a.workers[0].generation == "g4" and ended_and_shipped(a))
    assert (actual.workers[0].state, actual.workers[0].exit_code) == ("exited", 0)


def test_container_settings_come_from_the_environment_and_default_to_podmans_own() -> None:
    assert Podman(ContainerSettings.from_env({})).base() == ["podman"]
    env = {
        "RIGBASE_JOBS_OCI_RUNTIME": "runc",
        "RIGBASE_JOBS_CGROUP_MANAGER": "cgroupfs",
        "RIGBASE_JOBS_ULIMITS": "nofile=1024:1024, nproc=4096:4096",
        "RIGBASE_JOBS_NETWORK": "ns:/run/netns/lab-n1",
        "RIGBASE_JOBS_CDI_SPEC_DIRS": "/etc/cdi:/opt/cdi",
    }
    settings = ContainerSettings.from_env(env)
    assert (
        settings.ulimits == ("nofile=1024:1024", "nproc=4096:4096")
        and settings.network == "ns:/run/netns/lab-n1"
    )
    assert Podman(settings).base() == [
        *("podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs"),
        *("--cdi-spec-dir", "/etc/cdi", "--cdi-spec-dir", "/opt/cdi"),
    ]
    with pytest.raises(ValueError, match="RIGBASE_JOBS_DISK_QUOTA='xfs': use one of watch, storage-opt, off"):
        ContainerSettings.from_env({"RIGBASE_JOBS_DISK_QUOTA": "xfs"})


def test_a_served_worker_runs_once_its_server_answers_and_the_tunnel_dials_its_container(
    image: str, agents: Agents
) -> None:
    agent = agents()
    serve = ServeBinding(port=8000, health_path="/health")
    # the reply waits for the request's first line: a server that closes with the request unread sends
    # a TCP reset, and the reset can discard its answer before the client reads it
    reply = "SYSTEM:'read request; echo HTTP/1.0 200 OK; echo; echo ok'"
    command = f"sleep 3; exec socat TCP-LISTEN:8000,fork,reuseaddr {reply}"
    job = worker("job-served", command, serve=serve)
    actual = until(
        agent, [job], lambda a: bool(a.workers) and "nothing listens" in (a.workers[0].message or "")
    )
    assert actual.workers[0].state == "starting"  # its container runs; its server does not answer yet
    actual = until(agent, [job], lambda a: a.workers[0].state == "running")
    host, port = agent.dial(StreamOpen(stream_id="s" * 24, job_id="job-served", worker=0, port=8000))
    with socket.create_connection((host, port), timeout=10) as conn:
        conn.sendall(b"GET / HTTP/1.0\r\n\r\n")
        answer = b"".join(iter(lambda: conn.recv(4096), b""))  # its echoes come as separate segments
    assert answer.rstrip().endswith(b"ok")
    with pytest.raises(NotHere):
        agent.dial(StreamOpen(stream_id="s" * 24, job_id="job-other", worker=0, port=8000))
    assert actual.workers[0].idle_s is not None  # an endpoint's idleness: since its last connection


def test_a_served_worker_whose_server_keeps_exiting_is_restarted_then_fails_with_its_last_lines(
    image: str, agents: Agents
) -> None:
    agent = agents()
    job = worker("job-crashing", "echo crashing now; exit 4", serve=ServeBinding(port=8000))
    seen: set[str] = set()

    def ended(actual: JobsActual) -> bool:
        seen.update(w.message or "" for w in actual.workers)
        return ended_and_shipped(actual)

    actual = until(agent, [job], ended, timeout=60)
    assert any("starting it again (3 of 3)" in m for m in seen), seen
    end = actual.workers[0]
    assert (end.state, end.exit_code) == ("exited", 4)
    assert end.message is not None and "exited 4 times (last code 4)" in end.message
    assert end.message.endswith("crashing now | crashing now | crashing now | crashing now"), end.message


def test_the_nodes_images_name_its_localhost_images_and_a_registry_it_failed_to_pull_from(
    image: str, agents: Agents
) -> None:
    """What `job create --dry-run` warns from (contracts.jobs.NodeImages): the node holds the test's
    localhost/ image, and a worker whose registry does not answer (nothing listens on 127.0.0.1:9) leaves
    that registry's failed pull in the report, with podman's own error."""
    agent = agents()
    here = worker("job-local", "true")
    absent = worker("job-pull", "true", image="127.0.0.1:9/rigbase/absent:1")
    actual = until(agent, [here, absent], ended_and_shipped, timeout=60)
    assert {w.job_id: w.state for w in actual.workers} == {
        "job-local": "exited",
        "job-pull": "failed_to_start",
    }
    told = actual.images
    assert told is not None and image in told.local
    pull = told.pulls["127.0.0.1:9"]
    assert not pull.ok and "127.0.0.1:9" in (pull.message or ""), pull
