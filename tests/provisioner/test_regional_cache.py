"""The regional cache end to end over the real routes (docs/data.md, "The regional cache"): a real control
plane, nodes beating over its heartbeat route, and the minion's own object cache and cache agent fetching
with each node's credential.

- A local region: the node that runs a job fetches its dataset, reports it in its heartbeat
  (`provision node show`), and placement then prefers that node for the next job on the same data, saying
  so in the match table.
- A central region: the storage node fetches the region's objects once; the compute node's worker is
  not sent until the storage node holds its data, the job's reason says it is being cached, and the
  compute node reads the storage node's copy (a `shared` cache) without fetching a byte."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from contracts.object_cache import CacheRole
from minion.jobs.cache_agent import CacheAgent
from minion.jobs.objects import ControlPlaneObjects, ObjectCache
from minion.join.client import ControlPlane as MinionControlPlane
from minion.join.client import Enrollment
from provisioner.services.common.runtime import Runtime, attach
from provisioner.settings import Settings
from provisioner.store.engine import make_engine, make_sessionmaker
from tests.fixtures.control_plane import start_control_plane
from tests.provisioner.test_jobs_api import Fleet, _add_node, inventory, spec


class Counting:
    """The node routes of the real control plane, counting the chunk bytes they answer."""

    def __init__(self, inner: ControlPlaneObjects) -> None:
        self.inner, self.sent = inner, 0

    def manifest(self, object_id: str) -> bytes:
        return self.inner.manifest(object_id)

    def chunk(self, object_id: str, sha256: str) -> bytes:
        data = self.inner.chunk(object_id, sha256)
        self.sent += len(data)
        return data


@contextmanager
def regional_fleet(home: Path, hub_nodes: int = 1, threads: int = 8) -> Iterator[Fleet]:
    """Region `edge` (local storage: edge-1 with 16 vCPUs, edge-2 with 32) and region `hub` (central:
    storage node st-1, compute nodes hub-1… with `threads` vCPUs each)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RIGBASE_QUOTE_EVERY", "100000")
        with start_control_plane(home) as cp:
            engine = make_engine(cp.database_url)
            settings = Settings(home=cp.home, database_url=cp.database_url)
            f = Fleet(cp, attach(make_sessionmaker(engine), Runtime.from_settings(settings)))
            with cp.client() as http:
                for path, body in [
                    ("/v1/providers", {"kind": "physical"}),
                    ("/v1/regions", {"name": "edge", "provider": "physical"}),
                    ("/v1/regions", {"name": "hub", "provider": "physical", "storage_mode": "central"}),
                ]:
                    assert http.post(path, json=body).status_code == 201
                _add_node(f, http, "edge-1", "edge", inventory([], threads=16))
                _add_node(f, http, "edge-2", "edge", inventory([], threads=32))
                _add_node(f, http, "st-1", "hub", inventory([], threads=8), service="storage")
                for k in range(1, hub_nodes + 1):
                    _add_node(f, http, f"hub-{k}", "hub", inventory([], threads=threads))
            try:
                yield f
            finally:
                engine.dispose()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with regional_fleet(tmp_path_factory.mktemp("regional-cache") / "home") as f:
        yield f


def beat(fleet: Fleet, node: str, actual: dict[str, Any] | None = None) -> dict[str, Any]:
    """One heartbeat of `node` over the real route; its whole desired state."""
    answer = httpx.post(
        f"{fleet.cp.url}/v1/nodes/{fleet.node_ids[node]}/heartbeat",
        json={"version": 1, "actual": actual or {}},
        headers={"Authorization": f"Bearer {fleet.credentials[node]}"},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    return dict(answer.json()["desired"])


def agent_of(fleet: Fleet, node: str, root: Path, timeout: float = 30.0) -> tuple[CacheAgent, Counting]:
    """The minion's cache agent for `node`, its cache at `root`, fetching with the node's credential."""
    enrollment = Enrollment(fleet.cp.url, None, ca_certificate=fleet.cp.ca.read_text())
    ident = {"node_id": fleet.node_ids[node], "node_credential": fleet.credentials[node]}
    source = Counting(ControlPlaneObjects(MinionControlPlane(enrollment, timeout=timeout), lambda: ident))
    return CacheAgent(ObjectCache(root, source)), source  # type: ignore[arg-type]


def cached(fleet: Fleet, node: str, agent: CacheAgent, digest: str) -> dict[str, Any]:
    """Beat (the node's cache agent answering `objects`) until the node reports `digest` held."""
    deadline = time.monotonic() + 60
    report: dict[str, Any] = {}
    while digest not in report.get("held", []):
        assert time.monotonic() < deadline, f"{node} never held {digest}: {report}"
        desired = beat(fleet, node, {"objects": report} if report else None)
        report = agent.handle(desired["objects"])
        time.sleep(0.05)
    return beat(fleet, node, {"objects": report})


def dataset(fleet: Fleet, tmp_path: Path, name: str) -> dict[str, Any]:
    src = tmp_path / name
    src.mkdir()
    (src / "frames.bin").write_bytes(secrets.token_bytes(3_000_000))
    made = fleet.cp.provision("dataset", "create", name, "--source", str(src))
    assert made.returncode == 0, made.stderr
    return dict(json.loads(fleet.cp.provision("dataset", "show", name, "--json").stdout))


def job(fleet: Fleet, body: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
    with fleet.http() as http:
        answer = http.post("/v1/jobs", json={"spec": body, "dry_run": dry_run})
        assert answer.status_code in (200, 201), answer.text
        made = answer.json()
        return made if dry_run else dict(http.get(f"/v1/jobs/{made['id']}").json())


def stop(fleet: Fleet, job_id: str) -> None:
    with fleet.http() as http:
        assert http.post(f"/v1/jobs/{job_id}/stop").status_code == 200


def test_a_local_node_caches_for_itself_and_placement_then_prefers_it(fleet: Fleet, tmp_path: Path) -> None:
    frames = dataset(fleet, tmp_path, "frames")
    first = job(fleet, spec("big", gpus=0, cpu_count=20, region="edge", data={"datasets": ["frames"]}))
    assert first["workers"][0]["node"] == "edge-2", first  # the only node with 20 vCPUs free
    desired = beat(fleet, "edge-2")
    assert desired["objects"]["role"] == CacheRole.NODE.value
    assert [o["digest"] for o in desired["objects"]["objects"]] == [frames["digest"]]
    assert beat(fleet, "edge-1")["objects"] == {"role": "node", "objects": [], "drop": []}
    agent, source = agent_of(fleet, "edge-2", tmp_path / "edge-2")
    cached(fleet, "edge-2", agent, frames["digest"])
    assert source.sent == frames["size_bytes"]
    shown = json.loads(fleet.cp.provision("node", "show", "edge-2", "--json").stdout)
    assert shown["object_cache"]["held"] == [frames["digest"]]
    assert shown["object_cache"]["used_bytes"] == frames["size_bytes"]
    # edge-1 has more vCPUs free now (16 against 12) and would be chosen, but edge-2 holds the data
    body = spec("again", gpus=0, cpu_count=4, region="edge", data={"datasets": ["frames"]})
    plan = job(fleet, body, dry_run=True)["placement"]
    rows = {r["instance"]: r for r in plan["matches"]}
    assert rows["edge-2"]["selected"] and rows["edge-2"]["data"] == "cached", rows
    assert rows["edge-1"]["data"] == "fetch"
    without = job(fleet, spec("no-data", gpus=0, cpu_count=4, region="edge"), dry_run=True)["placement"]
    assert [r["instance"] for r in without["matches"]][:1] == ["edge-1"]
    assert {r["data"] for r in without["matches"]} == {"-"}
    table = fleet.cp.provision("job", "create", "-f", "-", "--dry-run", input=json.dumps(body))
    assert table.returncode == 0, table.stderr
    assert "Data" in table.stdout and "cached" in table.stdout, table.stdout
    # once the job ended and the dataset is removed, the node is told to drop its copy, and does
    stop(fleet, first["id"])
    ended = [
        {"job_id": w["job_id"], "worker": w["worker"], "generation": w["generation"], "state": "stopped"}
        for w in beat(fleet, "edge-2")["jobs"]["workers"]
    ]
    beat(fleet, "edge-2", {"jobs": {"workers": ended}})
    assert fleet.cp.provision("dataset", "remove", "frames", "--yes").returncode == 0
    deadline = time.monotonic() + 30  # the control plane answers the removed digests from a 10 s memo
    while frames["digest"] not in (wanted := beat(fleet, "edge-2")["objects"])["drop"]:
        assert time.monotonic() < deadline, wanted
        time.sleep(0.5)
    report = agent.handle(wanted)
    assert frames["digest"] not in report["held"]
    assert not [p for p in (tmp_path / "edge-2").iterdir() if not p.name.startswith(".")]


def test_a_central_region_pulls_once_on_its_storage_node_and_its_nodes_read_that_copy(
    fleet: Fleet, tmp_path: Path
) -> None:
    clips = dataset(fleet, tmp_path, "clips")
    made = job(fleet, spec("hub-job", gpus=0, cpu_count=4, region="hub", data={"datasets": ["clips"]}))
    assert made["workers"][0]["node"] == "hub-1", made
    assert made["reason"].startswith("Caching its data in the region (storage node st-1)"), made["reason"]
    # the compute node gets no worker yet, and fetches nothing itself
    hub = beat(fleet, "hub-1")
    assert hub["objects"] == {"role": "shared", "objects": [], "drop": []}
    assert not [w for w in hub["jobs"]["workers"] if w["job_id"] == made["id"]]
    export = tmp_path / "st-1-export" / "objects"
    storage, pulled = agent_of(fleet, "st-1", export)
    wanted = beat(fleet, "st-1")["objects"]
    assert wanted["role"] == "region" and [o["name"] for o in wanted["objects"]] == ["clips"]
    cached(fleet, "st-1", storage, clips["digest"])
    assert pulled.sent == clips["size_bytes"]
    hub = beat(fleet, "hub-1")
    (worker,) = [w for w in hub["jobs"]["workers"] if w["job_id"] == made["id"]]
    mount = next(m for m in worker["mounts"] if m["target"] == "/opt/ml/input")
    # hub-1's cache is the storage node's export, as its NFS mount shows it: read, never fetched
    shared, fetched = agent_of(fleet, "hub-1", export)
    shared.handle(hub["objects"])
    where = shared.cache.ensure(mount["object_id"], mount["digest"])
    assert (where / "frames.bin").stat().st_size == clips["size_bytes"]
    assert fetched.sent == 0
    with fleet.http() as http:
        reason = http.get(f"/v1/jobs/{made['id']}").json()["reason"]
    assert not reason.startswith("Caching"), reason
    # a second job in the region on the same data starts at once: nothing is pulled again
    second = job(fleet, spec("hub-job-2", gpus=0, cpu_count=4, region="hub", data={"datasets": ["clips"]}))
    assert not (second["reason"] or "").startswith("Caching"), second["reason"]
    assert [w for w in beat(fleet, "hub-1")["jobs"]["workers"] if w["job_id"] == second["id"]]
    cached(fleet, "st-1", storage, clips["digest"])
    assert pulled.sent == clips["size_bytes"]
    # once the jobs ended on hub-1, the storage node no longer keeps the object for them
    stop(fleet, made["id"])
    stop(fleet, second["id"])
    assert beat(fleet, "st-1")["objects"]["objects"], "kept while hub-1 may still run the workers"
    ended = [
        {"job_id": w["job_id"], "worker": w["worker"], "generation": w["generation"], "state": "stopped"}
        for w in beat(fleet, "hub-1")["jobs"]["workers"]
    ]
    beat(fleet, "hub-1", {"jobs": {"workers": ended}})
    assert beat(fleet, "st-1")["objects"]["objects"] == []
