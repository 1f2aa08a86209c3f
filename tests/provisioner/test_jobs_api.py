"""Jobs over HTTP against a real control plane (`provision serve`): create → placed or waiting (with the
reason), the node's share in the heartbeat answer of the real heartbeat route and its reports back, worker
exit codes → job state, stop, logs shipped by the node credential route (idempotent by offset, resumable),
the reconciler placing waiting jobs and failing or re-queueing the workers of lost nodes, a regional
resource pinning a job, and account isolation on every job route (another account's job answers 404).

The nodes are real rows of the server's store brought to `active` through the services, with an inventory
report and a node credential (the join itself has its own tests); every heartbeat goes through the HTTP
route with that credential, as the minion's loop sends it."""

from __future__ import annotations

import hashlib
import json
import secrets
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from contracts.jobs import LOG_ROUTE, USERNS_FIRST, USERNS_SIZE
from minion.jobs.agent import JobsAgent
from minion.jobs.logs import ControlPlaneLogs
from minion.join.client import ControlPlane as MinionControlPlane
from minion.join.client import Enrollment
from minion.settings import ContainerSettings
from provisioner.domain.states import WORKER_DONE, NodeState
from provisioner.reconcilers.loop import ReconcilerLoop
from provisioner.services.common.runtime import Runtime, attach
from provisioner.services.common.wakeups import Wake
from provisioner.services.fleet import nodes
from provisioner.services.jobs.job_assignments import LOG_TAIL_WINDOW
from provisioner.settings import Settings
from provisioner.store.engine import make_engine, make_sessionmaker
from provisioner.store.job_models import Job, JobWorker
from provisioner.store.join_models import NodeAttestation
from tests.fixtures.control_plane import PROVISION, ControlPlane, start_control_plane
from tests.minion.test_jobs_podman import IMAGE, RUNTIME, image  # noqa: F401  (the image fixture)

GIB = 2**30


def gpu(model: str, gpu_class: str) -> dict[str, Any]:
    return {
        "pci_address": "0000:01:00.0",
        "vendor_id": "10de",
        "device_id": "2204",
        "vendor": "NVIDIA",
        "name": model,
        "model": model,
        "gpu_class": gpu_class,
    }


def inventory(gpus: list[dict[str, Any]], threads: int = 32, memory_gib: int = 128) -> dict[str, Any]:
    return {
        "hostname": "n",
        "cpu": {"physical_cores": threads // 2, "threads": threads},
        "memory_total_bytes": memory_gib * GIB,
        "tpm": {"present": True},
        "gpus": gpus,
    }


@dataclass
class Fleet:
    """A server with regions and active nodes, the root account's token and a second account's."""

    cp: ControlPlane
    sessions: sessionmaker[Session]
    credentials: dict[str, str] = field(default_factory=dict)  # node name → node credential
    node_ids: dict[str, str] = field(default_factory=dict)
    other_token: str = ""

    def http(self, token: str | None = None) -> httpx.Client:
        client = self.cp.client()
        if token:
            client.headers["Authorization"] = f"Bearer {token}"
        return client

    def heartbeat(
        self,
        node: str,
        workers: list[dict[str, Any]] | None = None,
        jobs: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """One beat of the node over the real route (reporting `workers`, or a whole JobsActual `jobs`, and
        any other keys' values in `extra`); returns desired["jobs"]."""
        actual = (
            {"jobs": jobs} if jobs is not None else {} if workers is None else {"jobs": {"workers": workers}}
        ) | (extra or {})
        answer = httpx.post(
            f"{self.cp.url}/v1/nodes/{self.node_ids[node]}/heartbeat",
            json={"version": 1, "actual": actual},
            headers={"Authorization": f"Bearer {self.credentials[node]}"},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        return answer.json()["desired"]["jobs"]

    def log(
        self,
        node: str,
        job_id: str,
        worker: int,
        offset: int,
        data: str,
        eof: bool = False,
        as_node: str = "",
    ) -> httpx.Response:
        return httpx.post(
            self.cp.url + LOG_ROUTE.format(node_id=self.node_ids[node], job_id=job_id, worker=worker),
            json={"offset": offset, "data": data, "eof": eof},
            headers={"Authorization": f"Bearer {self.credentials[as_node or node]}"},
            timeout=30,
        )

    def reconcile(self) -> None:
        ReconcilerLoop(self.sessions, only=[Wake.JOBS], elect=False).run_once()

    def set_node(
        self, name: str, state: NodeState | None = None, *, seen_ago: timedelta | None = None
    ) -> None:
        with self.sessions.begin() as s:
            node = nodes.get(s, name)
            if state is not None:
                nodes.transition(s, node, state, actor="operator:test", reason="test")
            if seen_ago is not None:
                node.last_heartbeat_at = datetime.now(UTC) - seen_ago


NODES = {
    # name: (region, inventory)
    "gpu-1": ("lab-1", inventory([gpu("RTX 3090", "development")] * 2)),
    "gpu-2": ("lab-1", inventory([gpu("T4", "datacenter")])),
    "cpu-1": ("lab-2", inventory([], threads=16)),
}


def _add_node(
    fleet: Fleet, http: httpx.Client, name: str, region: str, inv: dict[str, Any], service: str = "compute"
) -> None:
    minion = secrets.token_hex(16)
    body = {"name": name, "region": region, "minion_id": minion, "service": service}
    answer = http.post("/v1/nodes", json=body)
    assert answer.status_code == 201, answer.text
    credential = "rbn_" + secrets.token_urlsafe(32)
    with fleet.sessions.begin() as s:
        node = nodes.get(s, name)
        for state in (NodeState.ENROLLING, NodeState.PROVISIONING, NodeState.ACTIVE):
            nodes.transition(s, node, state, actor="minion:test")
        nodes.record_report(s, node, inventory=inv, requirements={"ok": True, "rules": []})
        s.add(
            NodeAttestation(
                node_id=node.id,
                ek_sha256="00" * 32,
                ak_public=b"test",
                credential_sha256=hashlib.sha256(credential.encode()).hexdigest(),
            )
        )
        fleet.node_ids[name] = node.id
    fleet.credentials[name] = credential


@contextmanager
def running_fleet(home: Path) -> Iterator[Fleet]:
    """A control plane in `home` with regions lab-1 (private) and lab-2, nodes gpu-1 (2x RTX 3090),
    gpu-2 (1x T4) and cpu-1, a datastore `results` in lab-1 and a second account `other` with a token."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RIGBASE_JOB_NODE_GRACE_S", "0")  # a lost node fails its workers at the next pass
        mp.setenv("RIGBASE_QUOTE_EVERY", "100000")  # no continuous-attestation quote in these beats
        with start_control_plane(home) as cp:
            engine = make_engine(cp.database_url)
            settings = Settings(home=cp.home, database_url=cp.database_url, job_node_grace_s=0)
            sessions = attach(make_sessionmaker(engine), Runtime.from_settings(settings))
            f = Fleet(cp, sessions)
            with cp.client() as http:
                for path, body in [
                    ("/v1/providers", {"kind": "physical"}),
                    ("/v1/regions", {"name": "lab-1", "provider": "physical", "public_jobs": False}),
                    ("/v1/regions", {"name": "lab-2", "provider": "physical"}),
                    (
                        "/v1/datastores",
                        {
                            "name": "results",
                            "region": "lab-1",
                            "type": "nfs",
                            "address": "10.0.0.5",
                            "root": "/export/results",
                        },
                    ),
                    ("/v1/accounts", {"name": "other"}),
                ]:
                    answer = http.post(path, json=body)
                    assert answer.status_code == 201, (path, answer.text)
                for name, (region, inv) in NODES.items():
                    _add_node(f, http, name, region, inv)
                token = http.post("/v1/operator-tokens", json={"name": "other-admin", "account": "other"})
                assert token.status_code == 201, token.text
                f.other_token = token.json()["token"]
            yield f
            engine.dispose()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with running_fleet(tmp_path_factory.mktemp("jobs") / "home") as f:
        yield f


def spec(
    name: str, *, gpus: int = 1, types: tuple[str, ...] = ("RTX 3090",), workers: int = 1, **more: Any
) -> dict[str, Any]:
    resources: dict[str, Any] = {"gpu_count": gpus}
    if gpus:
        resources["gpu_types"] = list(types)
    else:
        resources["cpu_count"] = more.pop("cpu_count", 4)
    return {
        "name": name,
        "type": more.pop("type", "training"),
        "resources": resources,
        "workers": [f"echo worker {i}" for i in range(workers)],
        "environment": {"image": "localhost/rigbase-job:test"},
        **more,
    }


def create(fleet: Fleet, body: dict[str, Any], token: str | None = None, **extra: Any) -> httpx.Response:
    with fleet.http(token) as http:
        return http.post("/v1/jobs", json={"spec": body, **extra})


def report(assignment: dict[str, Any], state: str, **more: Any) -> dict[str, Any]:
    return {
        "job_id": assignment["job_id"],
        "worker": assignment["worker"],
        "generation": assignment["generation"],
        "state": state,
        **more,
    }


def mine(desired: dict[str, Any], job_id: str) -> list[dict[str, Any]]:
    return sorted((w for w in desired["workers"] if w["job_id"] == job_id), key=lambda w: w["worker"])


def job(fleet: Fleet, ref: str) -> dict[str, Any]:
    with fleet.http() as http:
        answer = http.get(f"/v1/jobs/{ref}")
        assert answer.status_code == 200, answer.text
        return answer.json()


def test_a_job_runs_to_succeeded_through_heartbeats_with_its_logs(fleet: Fleet) -> None:
    answer = create(fleet, spec("train-ok", workers=2))
    assert answer.status_code == 201, answer.text
    created = answer.json()
    job_id = created["id"]
    assert job_id.startswith("job_") and created["state"] == "starting" and created["node"] == "gpu-1"
    assert created["price_per_gpu_hour"] == 0.05  # RTX 3090: development class usage fee, locked
    assert created["placement"]["matches"][0]["selected"] and created["placement"]["fits"]

    desired = fleet.heartbeat("gpu-1")
    workers = mine(desired, job_id)
    assert [w["worker"] for w in workers] == [0, 1] and all(not w["stop"] for w in workers)
    assert workers[0]["gpu_count"] == 1 and workers[0]["command"] == "echo worker 0"
    assert workers[0]["env"]["RIGBASE_WORKERS"] == "2" and workers[0]["cpus"] == 16.0
    # the root account's jobs run in the first user namespace range on every node
    assert all(w["userns"] == {"first": USERNS_FIRST, "size": USERNS_SIZE} for w in workers)

    fleet.heartbeat("gpu-1", [report(workers[0], "running", gpu_indices=[0]), report(workers[1], "starting")])
    assert job(fleet, job_id)["state"] == "starting"
    fleet.heartbeat("gpu-1", [report(w, "running", gpu_indices=[w["worker"]]) for w in workers])
    shown = job(fleet, job_id)
    assert shown["state"] == "running" and [w["gpu_indices"] for w in shown["workers"]] == [[0], [1]]

    # logs: in order, a resend adds nothing, a gap is not stored and the ack says where to resume
    assert fleet.log("gpu-1", job_id, 0, 0, "line 1\n").json() == {"acked": 7, "eof": False}
    assert fleet.log("gpu-1", job_id, 0, 0, "line 1\n").json()["acked"] == 7
    assert fleet.log("gpu-1", job_id, 0, 14, "line 3\n").json()["acked"] == 7
    assert fleet.log("gpu-1", job_id, 0, 3, "e 1\nline 2\n").json()["acked"] == 14
    assert fleet.log("gpu-1", job_id, 0, 14, "line 3 é\n", eof=True).json() == {"acked": 24, "eof": True}
    assert fleet.log("gpu-2", job_id, 0, 0, "x").status_code == 404  # not running on that node
    assert fleet.log("gpu-1", job_id, 0, 0, "x", as_node="gpu-2").status_code == 401  # another's credential
    with fleet.http() as http:
        page = http.get(f"/v1/jobs/{job_id}/logs", params={"worker": 0}).json()
        assert page["data"] == "line 1\nline 2\nline 3 é\n" and page["complete"] and page["next_offset"] == 24
        assert (
            http.get(f"/v1/jobs/{job_id}/logs", params={"worker": 0, "offset": 7})
            .json()["data"]
            .startswith("line 2")
        )

    fleet.heartbeat("gpu-1", [report(w, "exited", exit_code=0) for w in workers])
    shown = job(fleet, job_id)
    assert shown["state"] == "succeeded" and [w["exit_code"] for w in shown["workers"]] == [0, 0]
    # worker 0's output is complete (eof); worker 1 stays listed, to stop, until its node says it shipped all
    tail = mine(fleet.heartbeat("gpu-1"), job_id)
    assert [(w["worker"], w["stop"]) for w in tail] == [(1, True)]
    fleet.heartbeat("gpu-1", [report(workers[1], "exited", exit_code=0, log_acked=0, log_eof=True)])
    assert mine(fleet.heartbeat("gpu-1"), job_id) == []  # nothing left for that node
    with fleet.http() as http:
        history = http.get(f"/v1/jobs/{job_id}/history").json()["items"]
    job_lines = [(h["from_state"], h["to_state"]) for h in history if h["name"] == "train-ok"]
    assert job_lines == [
        (None, "waiting"),
        ("waiting", "starting"),
        ("starting", "running"),
        ("running", "succeeded"),
    ]
    assert sum(1 for h in history if h["name"] == "train-ok worker 1") == 4  # created, placed, running, done


def test_a_worker_exiting_3_fails_the_job_and_stops_the_other(fleet: Fleet) -> None:
    job_id = create(fleet, spec("exit-three", workers=2)).json()["id"]
    workers = mine(fleet.heartbeat("gpu-1"), job_id)
    fleet.heartbeat("gpu-1", [report(w, "running") for w in workers])
    fleet.heartbeat("gpu-1", [report(workers[0], "running"), report(workers[1], "exited", exit_code=3)])
    shown = job(fleet, job_id)
    assert shown["state"] == "failed" and shown["reason"] == "worker 1: exited with code 3"
    again = mine(fleet.heartbeat("gpu-1"), job_id)
    # the sibling is stopped; the failed one stays listed (to stop) until its output is all shipped
    assert [(w["worker"], w["stop"]) for w in again] == [(0, True), (1, True)]
    fleet.heartbeat("gpu-1", [report(again[0], "stopped", exit_code=143)])
    states = [(w["state"], w["exit_code"]) for w in job(fleet, job_id)["workers"]]
    assert states == [("stopped", 143), ("failed", 3)]


def test_stop_sends_stop_and_the_report_ends_the_worker(fleet: Fleet) -> None:
    job_id = create(fleet, spec("to-stop")).json()["id"]
    (w,) = mine(fleet.heartbeat("gpu-1"), job_id)
    fleet.heartbeat("gpu-1", [report(w, "running")])
    with fleet.http() as http:
        stopped = http.post(f"/v1/jobs/{job_id}/stop").json()
        assert stopped["state"] == "stopped" and stopped["reason"] == "stopped by operator:admin"
        assert http.post(f"/v1/jobs/{job_id}/stop").status_code == 409  # already ended
    (w,) = mine(fleet.heartbeat("gpu-1"), job_id)
    assert w["stop"] and w["stop_grace_s"] > 0
    fleet.heartbeat("gpu-1", [report(w, "stopped", exit_code=137, log_eof=True)])
    assert job(fleet, job_id)["workers"][0]["state"] == "stopped"
    assert mine(fleet.heartbeat("gpu-1"), job_id) == []


def test_a_job_waits_with_the_reason_and_is_placed_when_capacity_frees(fleet: Fleet) -> None:
    h100 = create(fleet, spec("wants-h100", types=("H100 80GB",))).json()
    assert h100["state"] == "waiting" and h100["reason"].startswith("Waiting for GPUs:")
    assert "wrong GPU type" in h100["reason"]
    big = create(fleet, spec("both-3090s", gpus=2)).json()
    assert big["state"] == "starting"
    queued = create(fleet, spec("next-in-line", gpus=2)).json()
    assert queued["state"] == "waiting" and "too few free GPUs" in queued["reason"]
    assert queued["price_per_gpu_hour"] is None  # no price while it waits: the region it lands in decides
    fleet.reconcile()
    assert job(fleet, queued["id"])["state"] == "waiting"
    (w,) = mine(fleet.heartbeat("gpu-1"), big["id"])
    fleet.heartbeat("gpu-1", [report(w, "exited", exit_code=0)])
    fleet.reconcile()
    placed = job(fleet, queued["id"])
    assert placed["state"] == "starting" and placed["node"] == "gpu-1"
    assert placed["price_per_gpu_hour"] == 0.05  # fixed at placement, by gpu-1's region's rules
    with fleet.http() as http:
        assert http.post(f"/v1/jobs/{queued['id']}/stop").status_code == 200
        assert http.post(f"/v1/jobs/{h100['id']}/stop").json()["state"] == "stopped"
    (w,) = mine(fleet.heartbeat("gpu-1"), queued["id"])
    fleet.heartbeat("gpu-1", [report(w, "stopped", exit_code=0)])


def test_maintenance_takes_no_new_jobs_and_lets_running_ones_finish(fleet: Fleet) -> None:
    running = create(fleet, spec("before-maint", types=("T4",))).json()
    assert running["node"] == "gpu-2"
    (w,) = mine(fleet.heartbeat("gpu-2"), running["id"])
    fleet.heartbeat("gpu-2", [report(w, "running")])
    fleet.set_node("gpu-2", NodeState.MAINTENANCE)
    try:
        later = create(fleet, spec("during-maint", types=("T4",))).json()
        assert later["state"] == "waiting" and "in maintenance" in later["reason"]
        (still,) = mine(fleet.heartbeat("gpu-2"), running["id"])  # kept, not stopped
        assert not still["stop"]
        fleet.reconcile()
        assert job(fleet, running["id"])["state"] == "running"
        fleet.heartbeat("gpu-2", [report(w, "exited", exit_code=0)])
        assert job(fleet, running["id"])["state"] == "succeeded"
    finally:
        fleet.set_node("gpu-2", NodeState.ACTIVE)
    fleet.reconcile()
    assert job(fleet, later["id"])["state"] == "starting"
    with fleet.http() as http:
        http.post(f"/v1/jobs/{later['id']}/stop")
    (w,) = mine(fleet.heartbeat("gpu-2"), later["id"])
    fleet.heartbeat("gpu-2", [report(w, "stopped", exit_code=0)])


def test_a_lost_node_requeues_jobs_not_started_and_fails_started_ones(fleet: Fleet) -> None:
    started = create(fleet, spec("cpu-started", gpus=0, cpu_count=8)).json()
    unstarted = create(fleet, spec("cpu-unstarted", gpus=0, cpu_count=8)).json()
    assert started["node"] == unstarted["node"] == "cpu-1" and started["price_per_gpu_hour"] == 0.0
    (w,) = mine(fleet.heartbeat("cpu-1"), started["id"])
    fleet.heartbeat("cpu-1", [report(w, "running")])
    fleet.set_node("cpu-1", seen_ago=timedelta(minutes=5))  # offline past the window and the grace (0)
    fleet.reconcile()
    failed = job(fleet, started["id"])
    assert failed["state"] == "failed" and "went offline" in failed["reason"]
    requeued = job(fleet, unstarted["id"])  # re-queued, and placed again in the same pass elsewhere
    assert requeued["state"] == "starting" and requeued["node"] == "gpu-2"
    with fleet.http() as http:
        lines = [
            (h["to_state"], h["reason"])
            for h in http.get(f"/v1/jobs/{unstarted['id']}/history").json()["items"]
            if h["name"] == "cpu-unstarted"
        ]
    assert lines[2][0] == "waiting" and lines[2][1].startswith(
        "Waiting for CPUs: re-queued, node cpu-1 went offline"
    )
    (moved,) = mine(fleet.heartbeat("gpu-2"), unstarted["id"])
    assert moved["generation"].endswith(".2") and moved["cpus"] == 8.0
    assert mine(fleet.heartbeat("cpu-1"), unstarted["id"]) == []  # the old node drops it
    with fleet.http() as http:
        http.post(f"/v1/jobs/{unstarted['id']}/stop")
    fleet.heartbeat("gpu-2", [report(moved, "stopped", exit_code=0)])


def test_a_regional_resource_pins_the_job_and_refuses_a_gpu_type_not_there(fleet: Fleet) -> None:
    output = {"output": {"datastore": "results", "path": "/run-1"}}
    refused = create(fleet, spec("pinned-h100", types=("H100 80GB",), data=output))
    assert refused.status_code == 409, refused.text
    assert "lab-1" in refused.json()["message"] and "H100 80GB" in refused.json()["message"]
    with fleet.http() as http:
        assert all(j["name"] != "pinned-h100" for j in http.get("/v1/jobs").json()["items"])
        dry = http.post(
            "/v1/jobs/dry-run", json={"spec": spec("pinned-t4", types=("T4",), data=output)}
        ).json()
    assert dry["pinned_region"] == "lab-1" and "results" in dry["pinned_by"]
    assert [m["instance"] for m in dry["matches"]] == ["gpu-2"]
    pinned = create(fleet, spec("pinned-t4", types=("T4",), data=output)).json()
    (w,) = mine(fleet.heartbeat("gpu-2"), pinned["id"])
    assert w["mounts"] == [
        {
            "source_kind": "datastore",
            "datastore": "results",
            "path": "/run-1",
            "target": "/opt/ml/output",
            "read_only": False,
        }
    ]
    assert [d["name"] for d in fleet.heartbeat("gpu-2")["datastores"]] == ["results"]
    with fleet.http() as http:
        http.post(f"/v1/jobs/{pinned['id']}/stop")
    fleet.heartbeat("gpu-2", [report(w, "stopped", exit_code=0)])


def test_datastore_passwords_go_only_with_running_work_on_a_node_in_good_standing(fleet: Fleet) -> None:
    """Tenancy findings 4 and 12: an errored node kept receiving datastore passwords, and so did a node
    that kept reporting a worker that had ended (the log window restarted with every report); a job's
    environment values were stored in clear and returned by `job show`."""
    output = {"output": {"datastore": "results", "path": "/run-2"}}
    body = spec("secret-t4", types=("T4",), data=output)
    body["environment"]["env"] = {"PLAIN": "1", "HF_TOKEN": {"value": "hf_s3cret", "secret": True}}
    pinned = create(fleet, body).json()
    # finding 12: sealed at rest, never in an answer
    assert pinned["spec"]["environment"]["env"] == {"PLAIN": "1", "HF_TOKEN": {"secret": True}}
    assert "hf_s3cret" not in json.dumps(job(fleet, pinned["id"]))
    with fleet.sessions() as s:
        stored = s.scalar(select(Job).where(Job.id == pinned["id"]))
        assert stored is not None and stored.sealed_env and "hf_s3cret" not in stored.sealed_env
        assert "hf_s3cret" not in json.dumps(stored.spec)
    (w,) = mine(fleet.heartbeat("gpu-2"), pinned["id"])
    assert w["env"]["HF_TOKEN"] == "hf_s3cret" and w["env"]["PLAIN"] == "1"
    fleet.heartbeat("gpu-2", [report(w, "running")])
    assert [d["name"] for d in fleet.heartbeat("gpu-2")["datastores"]] == ["results"]
    with fleet.sessions.begin() as s:  # failed continuous attestation, as the heartbeat would mark it
        nodes.get(s, "gpu-2").state = NodeState.ERRORED.value
    try:
        errored = fleet.heartbeat("gpu-2")
        assert mine(errored, pinned["id"]) and errored["datastores"] == []
        assert "HF_TOKEN" not in mine(errored, pinned["id"])[0]["env"]
    finally:
        with fleet.sessions.begin() as s:
            nodes.get(s, "gpu-2").state = NodeState.ACTIVE.value
    # ended, its log not all shipped: listed (stop) to ship it, without the password, however often
    # the node reports it again
    fleet.heartbeat("gpu-2", [report(w, "exited", exit_code=0)])
    for _ in range(3):
        desired = fleet.heartbeat("gpu-2", [report(w, "exited", exit_code=0)])
        (listed,) = mine(desired, pinned["id"])
        assert listed["stop"] and desired["datastores"] == [] and "HF_TOKEN" not in listed["env"]
    with fleet.sessions.begin() as s:  # the control plane's end, not the reports, starts the window
        ended = s.scalar(select(JobWorker.ended_at).where(JobWorker.job_id == pinned["id"]))
        assert ended is not None
        s.execute(
            update(JobWorker)
            .where(JobWorker.job_id == pinned["id"])
            .values(ended_at=ended - LOG_TAIL_WINDOW - timedelta(seconds=1))
        )
    again = fleet.heartbeat("gpu-2", [report(w, "exited", exit_code=0)])
    assert not mine(again, pinned["id"]), "past the window from the recorded end: forgotten"


def test_a_bad_spec_stores_nothing(fleet: Fleet) -> None:
    bad = spec("bad-one", gpus=0, cpu_count=6)
    answer = create(fleet, bad)
    assert answer.status_code == 422 and "resources.cpu_count" in answer.json()["message"]
    with fleet.http() as http:
        assert all(j["name"] != "bad-one" for j in http.get("/v1/jobs").json()["items"])


def test_another_accounts_jobs_and_logs_answer_404_on_every_route(fleet: Fleet) -> None:
    theirs = create(fleet, spec("private-job", types=("T4",))).json()
    fleet.log("gpu-2", theirs["id"], 0, 0, "secret output\n")
    other = fleet.other_token
    with fleet.http(other) as http:
        assert http.get("/v1/jobs").json()["items"] == []
        for ref in (theirs["id"], theirs["name"]):
            calls: list[tuple[str, str, dict[str, Any] | None]] = [
                ("GET", f"/v1/jobs/{ref}", None),
                ("GET", f"/v1/jobs/{ref}/history", None),
                ("GET", f"/v1/jobs/{ref}/logs", None),
                ("POST", f"/v1/jobs/{ref}/stop", {}),
            ]
            for method, path, body in calls:
                answer = http.request(method, path, json=body)
                assert answer.status_code == 404, (method, path, answer.text)
                # exactly what a job that never existed answers
                missing = http.request(method, path.replace(ref, "job_0000000000000000"), json=body).json()
                assert answer.json() == {
                    **missing,
                    "message": missing["message"].replace("job_0000000000000000", ref),
                }
                assert "secret" not in answer.text
        # the other account's projects: its own default only; naming ours is a 404 too
        assert (
            create(fleet, spec("in-their-project", types=("T4",)), other, project="default").status_code
            == 201
        )
        with fleet.http() as root:
            our_default = [p for p in root.get("/v1/projects").json()["items"] if p["name"] == "default"][0][
                "id"
            ]
        assert create(fleet, spec("sneaky", types=("T4",)), other, project=our_default).status_code == 404
        # lab-1 is private (public jobs off): their job never lands there, it waits
        waiting = http.get("/v1/jobs/in-their-project").json()
        assert waiting["state"] == "waiting" and "public jobs off" in waiting["reason"]
        assert http.post("/v1/jobs/in-their-project/stop").status_code == 200
    with fleet.http() as http:
        assert http.get("/v1/jobs/in-their-project").status_code == 404
        http.post(f"/v1/jobs/{theirs['id']}/stop")
    (w,) = mine(fleet.heartbeat("gpu-2"), theirs["id"])
    fleet.heartbeat("gpu-2", [report(w, "stopped", exit_code=0)])


def test_the_job_spec_schema_is_published(fleet: Fleet) -> None:
    with fleet.http() as http:
        schema = http.get("/v1/jobs/schema").json()
    assert schema["title"] == "rigbase job spec" and "resources" in schema["properties"]
    assert json.dumps(schema)  # plain JSON


def test_reports_of_another_generation_or_node_change_nothing(fleet: Fleet) -> None:
    job_id = create(fleet, spec("stale-reports", types=("T4",))).json()["id"]
    (w,) = mine(fleet.heartbeat("gpu-2"), job_id)
    fleet.heartbeat("gpu-2", [{**report(w, "exited", exit_code=0), "generation": "old.1"}])
    fleet.heartbeat("gpu-1", [report(w, "exited", exit_code=0)])
    assert job(fleet, job_id)["state"] == "starting"
    with fleet.http() as http:
        http.post(f"/v1/jobs/{job_id}/stop")
    fleet.heartbeat("gpu-2", [report(w, "stopped", exit_code=0)])


def test_a_reservation_goes_with_worker_0_and_serves_one_job_at_a_time(fleet: Fleet) -> None:
    with fleet.http() as http:
        body = {"name": "nb", "region": "lab-1", "hostname": "notebook", "port": 8888}
        assert http.post("/v1/reservations", json=body).status_code == 201
    endpoint = create(fleet, spec("serve-nb", types=("T4",), type="endpoint", reservation="nb")).json()
    assert endpoint["state"] == "starting" and endpoint["node"] == "gpu-2"
    (w,) = mine(fleet.heartbeat("gpu-2"), endpoint["id"])
    assert w["reservation"] == {"port": 8888, "hostname": "notebook", "protocol": "tcp"}
    second = create(fleet, spec("serve-nb-too", types=("T4",), type="endpoint", reservation="nb"))
    assert second.status_code == 409 and "used by job 'serve-nb'" in second.json()["message"]
    with fleet.http() as http:
        http.post(f"/v1/jobs/{endpoint['id']}/stop")
        assert http.post("/v1/reservations/nb/assign", json={"node": "gpu-1"}).status_code == 200
    fleet.heartbeat("gpu-2", [report(w, "stopped", exit_code=0, log_eof=True)])
    assigned = create(fleet, spec("serve-nb-3", types=("T4",), type="endpoint", reservation="nb"))
    assert assigned.status_code == 409 and "reservation unassign nb" in assigned.json()["message"]


@contextmanager
def minion_agent(fleet: Fleet, node: str, tmp_path: Path) -> Iterator[JobsAgent]:
    """The minion's own jobs agent (minion/jobs) for a pod-only node `node` (added here, 64 vCPUs so CPU
    jobs prefer it), shipping logs to this control plane with the node's credential."""
    with fleet.cp.client() as http:
        _add_node(fleet, http, node, "lab-2", inventory([], threads=64, memory_gib=4))
    (tmp_path / "cache").mkdir()
    settings = ContainerSettings(  # a jobs network of this module's own (tests/minion/test_jobs_podman.py)
        **RUNTIME,  # type: ignore[arg-type]
        cache_dir=tmp_path / "cache",
        datastore_dir=tmp_path / "ds",
        jobs_network="rigbase-jt-api",
        jobs_subnet="10.231.2.0/24",
    )
    client = MinionControlPlane(Enrollment(fleet.cp.url, None, ca_certificate=fleet.cp.ca.read_text()))
    ids = {"node_id": fleet.node_ids[node], "node_credential": fleet.credentials[node]}
    agent = JobsAgent.create(settings, tmp_path / "state", ControlPlaneLogs(client, lambda: ids))
    try:
        yield agent
    finally:
        agent.close(wait_s=5)
        client.close()
        if agent.network is not None:
            agent.network.remove()


def drive(
    fleet: Fleet, node: str, agent: JobsAgent, job_id: str, done: Any, timeout: float = 60
) -> dict[str, Any]:
    """The minion's heartbeat loop, faster: desired from each answer to the agent, its actual back, until
    `done(job)` holds for the job as the API shows it (and its logs are complete); returns the job."""
    desired = fleet.heartbeat(node)
    deadline = time.monotonic() + timeout
    while True:
        shown = job(fleet, job_id)
        if done(shown):
            with fleet.http() as http:
                pages = [
                    http.get(f"/v1/jobs/{job_id}/logs", params={"worker": w["index"]}).json()
                    for w in shown["workers"]
                ]
            if all(page["complete"] for page in pages):
                return {**shown, "logs": [page["data"] for page in pages]}
        assert time.monotonic() < deadline, shown
        desired = fleet.heartbeat(node, jobs=agent.handle(desired))
        time.sleep(0.3)


def podman_spec(name: str, *commands: str) -> dict[str, Any]:
    body = spec(name, gpus=0, cpu_count=4, workers=len(commands))
    body["workers"] = list(commands)
    body["environment"] = {"image": IMAGE}
    return body


@pytest.mark.usefixtures("image")  # tests/minion/test_jobs_podman.py: an image made of this machine's sh
def test_a_real_minion_runs_a_job_in_podman_through_the_heartbeat_and_ships_its_logs(
    fleet: Fleet, tmp_path: Path
) -> None:
    """End to end: the minion's jobs agent gets its work from this control plane's heartbeat answers, runs
    real containers and ships their output over the node credential route."""
    with minion_agent(fleet, "pod-1", tmp_path) as agent:
        body = podman_spec(
            "e2e", "echo hello from $RIGBASE_WORKER of $RIGBASE_WORKERS; echo oops >&2", "echo two; exit 3"
        )
        created = create(fleet, body).json()
        assert created["node"] == "pod-1", created
        # the job fails with worker 1; worker 0 ends as its minion reports it (exited, or stopped by the
        # failure), which may take one more beat than the job's own state
        shown = drive(
            fleet,
            "pod-1",
            agent,
            created["id"],
            lambda j: j["state"] == "failed" and all(w["state"] in WORKER_DONE for w in j["workers"]),
        )
    assert shown["reason"] == "worker 1: exited with code 3"
    assert [(w["state"], w["exit_code"]) for w in shown["workers"]] in (
        [("succeeded", 0), ("failed", 3)],
        [("stopped", 0), ("failed", 3)],
    )
    assert shown["logs"] == ["hello from 0 of 2\noops\n", "two\n"]
    with fleet.http() as http:
        history = http.get(f"/v1/jobs/{created['id']}/history").json()["items"]
    # the minion's reports moved the workers and the job (a worker that ends between two beats may go from
    # starting straight to its end)
    minion_lines = [h for h in history if h["actor"].startswith("minion:")]
    assert [h["to_state"] for h in minion_lines if h["name"] == "e2e"][-1] == "failed"
    assert {h["to_state"] for h in minion_lines if h["name"] == "e2e worker 1"} >= {"failed"}


@pytest.mark.usefixtures("image")
def test_the_control_plane_killed_mid_run_loses_no_log_line(tmp_path: Path) -> None:
    """SIGKILL the control plane while a real container writes; start it again on the same store and
    address: the minion resends from the last acknowledged offset and every line is there once."""
    home = tmp_path / "home"
    with running_fleet(home) as fleet, minion_agent(fleet, "pod-9", tmp_path) as agent:
        lines = "i=0; while [ $i -lt 40 ]; do echo line $i; i=$((i+1)); sleep 0.1; done"
        created = create(fleet, podman_spec("chatty", lines)).json()
        drive(fleet, "pod-9", agent, created["id"], lambda j: j["workers"][0]["log_bytes"] > 0)
        port = int(fleet.cp.url.rsplit(":", 1)[1])
        fleet.cp.process.kill()
        fleet.cp.process.wait()
        time.sleep(1.5)  # the container goes on writing while nobody acknowledges
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("RIGBASE_QUOTE_EVERY", "100000")
            with start_control_plane(home, port=port) as again:
                fleet.cp = again
                shown = drive(fleet, "pod-9", agent, created["id"], lambda j: j["state"] == "succeeded")
    assert shown["logs"] == ["".join(f"line {i}\n" for i in range(40))]


def test_a_project_with_a_live_job_cannot_be_removed(fleet: Fleet) -> None:
    with fleet.http() as http:
        assert http.post("/v1/projects", json={"name": "exp"}).status_code == 201
        waiting = create(fleet, spec("in-exp", types=("H100 80GB",)), project="exp").json()
        assert waiting["project"] == "exp" and waiting["state"] == "waiting"
        refused = http.delete("/v1/projects/exp")
        assert refused.status_code == 409 and "has jobs" in refused.json()["message"]
        assert [j["name"] for j in http.get("/v1/jobs", params={"project": "exp"}).json()["items"]] == [
            "in-exp"
        ]
        http.post(f"/v1/jobs/{waiting['id']}/stop")
        assert http.delete("/v1/projects/exp").status_code == 200


def test_a_regions_jobs_reach_the_lan_only_once_its_admins_allow_it(fleet: Fleet) -> None:
    """Tenancy finding 6: the node narrows its jobs' network (minion/jobs/network.py) by the region's
    policy, which every heartbeat answer carries; the LAN is closed until the region's admins open it."""
    assert fleet.heartbeat("gpu-1")["network"] == {"lan": False}
    opened = fleet.cp.provision("region", "update", "lab-1", "--jobs-lan", "--json")
    assert opened.returncode == 0, opened.stderr
    assert json.loads(opened.stdout)["jobs_lan"] is True
    assert fleet.heartbeat("gpu-1")["network"] == {"lan": True}
    assert fleet.heartbeat("cpu-1")["network"] == {"lan": False}, "another region keeps its own policy"
    with fleet.http(fleet.other_token) as other:  # another account's token: the region looks missing
        assert other.patch("/v1/regions/lab-1", json={"jobs_lan": False}).status_code == 404
    with fleet.http() as http:
        nothing = http.patch("/v1/regions/lab-1", json={})
        assert nothing.status_code == 422 and "nothing to change" in nothing.json()["message"]
        assert http.patch("/v1/regions/lab-1", json={"jobs_lan": False}).json()["jobs_lan"] is False
    assert fleet.heartbeat("gpu-1")["network"] == {"lan": False}


def test_a_projects_registry_key_pulls_its_own_jobs_images_and_is_never_shown(
    fleet: Fleet, tmp_path: Path
) -> None:
    """Tenancy finding 6 (and the project keys finding 12 names): a job's private image is pulled with
    its project's registry key, which the node gets only with a worker that starts or runs; no answer
    shows the secret, another account never reaches it, and a secret file others may read is refused."""
    secret = tmp_path / "registry-token"
    secret.write_text("hunter2-registry\n")
    secret.chmod(0o644)
    registry = "registry.example.com:5000"
    key = ("project", "key", "set", "default", "--registry", registry, "-u", "robot", "--secret-file")
    loose = fleet.cp.provision(*key, str(secret))
    assert loose.returncode == 2 and f"chmod 600 {secret}" in loose.stderr, loose.stderr
    secret.chmod(0o600)
    made = fleet.cp.provision(*key, str(secret))
    assert made.returncode == 0 and made.stdout.strip().startswith("key_"), made.stderr
    bad = fleet.cp.provision(*key[:5], "not a host/", *key[6:], str(secret))
    assert bad.returncode != 0 and "host[:port]" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    listed = fleet.cp.provision("project", "key", "list", "default", "--json")
    (shown,) = json.loads(listed.stdout)  # a list, as every `list --json`
    assert (shown["registry"], shown["username"]) == (registry, "robot") and "hunter2" not in listed.stdout

    private = create(fleet, spec("pulls-private", environment={"image": f"{registry}/team/train:1"})).json()
    hub = {"image": "docker.io/library/python:3.12"}
    public = create(fleet, spec("pulls-public", environment=hub)).json()
    desired = fleet.heartbeat(private["node"])
    (w,) = mine(desired, private["id"])
    assert w["registry_auth"] == {"registry": registry, "username": "robot", "password": "hunter2-registry"}
    (pw,) = mine(fleet.heartbeat(public["node"]), public["id"])
    assert pw["registry_auth"] is None, "another registry's image gets no key"
    with fleet.http() as http:
        assert "hunter2" not in http.get(f"/v1/jobs/{private['id']}").text
        assert "hunter2" not in http.get("/v1/projects/default/keys").text
        our_default = http.get("/v1/projects/default").json()["id"]
    with fleet.http(fleet.other_token) as other:  # another account: its own default has no key; ours is 404
        assert other.get("/v1/projects/default/keys").json()["items"] == []
        assert other.get(f"/v1/projects/{our_default}/keys").status_code == 404
        assert other.delete(f"/v1/projects/{our_default}/keys/registry/{registry}").status_code == 404

    # the worker ends: listed once more to ship its log, without the key
    fleet.heartbeat(private["node"], [report(w, "exited", exit_code=0)])
    assert all(a["registry_auth"] is None for a in mine(fleet.heartbeat(private["node"]), private["id"]))
    removed = fleet.cp.provision("project", "key", "remove", "default", "--registry", registry, "--yes")
    assert removed.returncode == 0, removed.stderr
    with fleet.http() as http:
        assert http.get("/v1/projects/default/keys").json()["items"] == []
        http.post(f"/v1/jobs/{public['id']}/stop")
    (pw,) = mine(fleet.heartbeat(public["node"]), public["id"])
    fleet.heartbeat(public["node"], [report(pw, "stopped", exit_code=0)])


def test_status_counts_gpus_free_and_held_and_jobs_running_and_waiting(fleet: Fleet) -> None:
    def status(token: str | None = None) -> dict[str, Any]:
        env = fleet.cp.env | ({"RIGBASE_TOKEN": token} if token else {})
        out = subprocess.run([str(PROVISION), "status", "--json"], env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    before = status()
    lab1 = {r["region"]: r for r in before["regions"]}["lab-1"]
    assert lab1["gpus"] == 3  # gpu-1's two RTX 3090s and gpu-2's T4
    big = create(fleet, spec("holds-both-3090s", gpus=2)).json()
    (w,) = mine(fleet.heartbeat("gpu-1"), big["id"])
    fleet.heartbeat("gpu-1", [report(w, "running", gpu_indices=[0, 1])])
    waits = create(fleet, spec("waits-for-h100", types=("H100 80GB",))).json()
    assert waits["state"] == "waiting"
    after = status()
    held = {r["region"]: r for r in after["regions"]}["lab-1"]
    assert held["gpus_allocated"] - lab1["gpus_allocated"] == 2
    assert after["jobs_running"] - before["jobs_running"] == 1
    assert after["jobs_waiting"] - before["jobs_waiting"] == 1 and after["oldest_wait_s"] >= 0
    table = fleet.cp.provision("status").stdout
    assert "GPUS FREE" in table and "GPUS USED" in table
    assert f"jobs: {after['jobs_running']} running, {after['jobs_waiting']} waiting, the oldest for" in table
    # another account counts only its own jobs, and sees none of lab-1's GPUs
    theirs = status(fleet.other_token)
    assert theirs["jobs_running"] == 0 and theirs["jobs_waiting"] == 0
    assert "lab-1" not in {r["region"] for r in theirs["regions"]}
    with fleet.http() as http:
        for ref in (big["id"], waits["id"]):
            assert http.post(f"/v1/jobs/{ref}/stop").status_code == 200
    fleet.heartbeat("gpu-1", [report(w, "stopped", exit_code=143, log_eof=True)])


def test_node_show_summarises_inventory_and_requirements_and_yaml_keeps_the_reports(fleet: Fleet) -> None:
    shown = fleet.cp.provision("node", "show", "gpu-1")
    assert shown.returncode == 0, shown.stderr
    fields = dict(line.split(None, 1) for line in shown.stdout.splitlines() if " " in line)
    assert fields["inventory"].strip().startswith("2x RTX 3090, ") and "GiB RAM" in fields["inventory"]
    assert fields["requirements"].strip() == "pass" and "{" not in shown.stdout
    raw = yaml.safe_load(fleet.cp.provision("node", "show", "gpu-1", "-o", "yaml").stdout)
    assert [g["model"] for g in raw["inventory"]["gpus"]] == ["RTX 3090", "RTX 3090"]
    assert raw["requirements"] == {"ok": True, "rules": []}


def test_job_show_names_every_node_its_workers_are_on(fleet: Fleet) -> None:
    body = json.dumps(spec("two-nodes", workers=2))
    created = fleet.cp.provision("job", "create", "-f", "-", "--yes", input=body)
    assert created.returncode == 0, created.stderr
    assert "starting on gpu-1" in created.stderr
    job_id = created.stdout.strip()
    # a worker elsewhere, as a job across nodes will have (placement puts both on gpu-1 today)
    with fleet.sessions.begin() as s:
        s.execute(
            update(JobWorker)
            .where(JobWorker.job_id == job_id, JobWorker.index == 1)
            .values(node_id=fleet.node_ids["gpu-2"])
        )
    shown = fleet.cp.provision("job", "show", job_id)
    line = next(li for li in shown.stdout.splitlines() if li.startswith("node "))
    assert line.split(None, 1)[1].strip() == "gpu-1, gpu-2", shown.stdout
    with fleet.http() as http:
        assert http.post(f"/v1/jobs/{job_id}/stop").status_code == 200


@pytest.mark.usefixtures("image")
def test_a_dry_run_warns_of_an_image_the_node_lacks_or_a_registry_it_failed_to_pull_from(
    tmp_path: Path,
) -> None:
    """issue 44: the minion tells what images it holds and how its pulls went (contracts.jobs.NodeImages,
    through the real jobs agent and heartbeat); `job create --dry-run` warns of a localhost/ image the
    chosen node lacks and of a registry its last pull from failed, and says nothing of an image it has."""
    absent = "127.0.0.1:9/rigbase/absent:1"  # nothing listens there: the pull fails, no host is contacted
    with running_fleet(tmp_path / "home") as fleet, minion_agent(fleet, "pod-1", tmp_path) as agent:
        body = podman_spec("pulls", "true")
        body["environment"] = {"image": absent}
        created = create(fleet, body).json()
        assert created["node"] == "pod-1", created
        drive(fleet, "pod-1", agent, created["id"], lambda j: j["state"] == "failed")
        fleet.heartbeat("pod-1", jobs=agent.handle(fleet.heartbeat("pod-1")))
        with fleet.sessions.begin() as s:
            told = nodes.get(s, "pod-1").images
        assert told is not None and IMAGE in told["local"] and not told["pulls"]["127.0.0.1:9"]["ok"], told

        def warnings(image: str) -> list[str]:
            job_file = tmp_path / "dry.yaml"
            dry_body = podman_spec("dry", "true")
            dry_body["environment"] = {"image": image}
            job_file.write_text(json.dumps(dry_body))
            dry = fleet.cp.provision("job", "create", "-f", str(job_file), "--dry-run")
            assert dry.returncode == 0 and "pod-1" in dry.stdout, dry.stdout + dry.stderr
            return [line for line in dry.stderr.splitlines() if line.startswith("warning: ")]

        (failed,) = warnings(absent)
        assert failed.startswith("warning: node 'pod-1' last failed to pull from 127.0.0.1:9 (") and (
            "connection refused" in failed
        ), failed
        assert warnings("localhost/rigbase-not-here:1") == [
            "warning: node 'pod-1' does not hold localhost/rigbase-not-here:1: a localhost/ image is the "
            "node's own and is never pulled, so the job would fail to start there; build or load it on the "
            "node, or name a registry image"
        ]
        assert warnings(IMAGE) == []
