"""Distributed and multi-worker jobs in the local lab, for real (issue 41): `provision lab up --nodes 4`
(four nodes of 2 simulated RTX A6000s, each its own network namespace on the lab's LAN), then

- a gang of 3 workers x 2 GPUs, one per node, whose workers meet over TCP at the addresses and ports
  rigbase gave them (docs/examples/lab-gang.yaml), and a gang that fails whole when one worker exits 1;
- an independent sweep of 4 one-GPU workers on two nodes, where the failing one leaves the other three to
  finish, each with its own start and end (docs/examples/lab-sweep.yaml);
- an OpenPAI job with a 0-GPU parameter server and 1-GPU workers, each reading OpenPAI's variables
  (docs/examples/lab-openpai-ps.json, with // comments);
- a Launch `task_type: serve` file, which becomes an endpoint job (docs/examples/lab-launch-serve.yaml);
- a gang the fleet could never hold, refused at create with what would make it fit."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tests.provisioner.test_lab import (  # noqa: F401 - the fixtures are used by name
    cached_lab_home,
    lab_home,
    provision,
    rootfs_cache,
)
from tests.provisioner.test_lab_jobs import EXAMPLES, _job, _ok, _wait_state

NODES = 4
TIMEOUT_S = 180


def _node(home: Path, name: str) -> dict[str, Any]:
    return dict(json.loads(_ok(home, "node", "show", name, "--json")))


def _logs(home: Path, name: str, worker: int) -> list[str]:
    return _ok(home, "job", "logs", name, "--worker", str(worker), "--follow", timeout=60).splitlines()


def test_gangs_sweeps_and_task_roles_run_across_the_labs_nodes(cached_lab_home: Path) -> None:  # noqa: F811
    home = cached_lab_home
    up = provision(home, "lab", "up", "--nodes", str(NODES), "--json", timeout=900)
    assert up.returncode == 0, up.stderr[-3000:]
    for n in range(1, NODES + 1):
        _ok(home, "node", "maintenance", f"node-{n}", "off")  # only active nodes take jobs
    names = [f"node-{n}" for n in range(1, NODES + 1)]
    addresses = {name: _node(home, name)["inventory"]["observed_address"] for name in names}
    assert len(set(addresses.values())) == NODES, addresses
    _gang_meets(home, addresses)
    _gang_fails_whole(home)
    _sweep_workers_end_on_their_own(home)
    _task_roles_find_each_other(home, addresses)
    _serve_is_an_endpoint_and_never_is_refused(home)
    down = provision(home, "lab", "down", "--yes", timeout=300)
    assert down.returncode == 0, down.stderr


def _gang_meets(home: Path, addresses: dict[str, str]) -> None:
    """Three workers on three nodes meet at the addresses and ports they were given."""
    _ok(home, "job", "create", "-f", str(EXAMPLES / "lab-gang.yaml"), "-y")
    gang = _wait_state(home, "lab-gang", {"succeeded", "failed"}, timeout=TIMEOUT_S)
    assert gang["state"] == "succeeded", (gang["reason"], _ok(home, "job", "logs", "lab-gang"))
    on = [w["node"] for w in gang["workers"]]
    assert len(set(on)) == 3, on
    met = _logs(home, "lab-gang", 0)
    assert met[-1] == "rank 0 met " + ", ".join(f"rank {r} from {addresses[on[r]]}" for r in (1, 2)), met
    for rank in (1, 2):
        said = _logs(home, "lab-gang", rank)
        assert said[-1] == f"rank {rank} got go from {addresses[on[0]]}:{gang['workers'][0]['port']}", said
        peers = ",".join(f"{addresses[on[r]]}:{gang['workers'][r]['port']}" for r in range(3))
        assert said[0] == f"rank {rank} of 3, peers {peers}", said


def _gang_fails_whole(home: Path) -> None:
    """Worker 1 exits 1; the others (sleeping) are stopped."""
    failing = home / "gang-fails.yaml"
    failing.write_text(
        "name: gang-fails\ntype: training\nkind: gang\nresources: {gpu_types: [RTX A6000], gpu_count: 1}\n"
        "workers: ['sleep 300', 'sleep 1; exit 1', 'sleep 300']\n"
        "environment: {image: localhost/rigbase-lab:latest}\n"
    )
    _ok(home, "job", "create", "-f", str(failing), "-y")
    failed = _wait_state(home, "gang-fails", {"failed"}, timeout=TIMEOUT_S)
    assert failed["reason"] == "worker 1: exited with code 1"
    ended = {w["index"]: w for w in _wait_workers_ended(home, "gang-fails")}
    assert [ended[i]["state"] for i in range(3)] == ["stopped", "failed", "stopped"]


def _sweep_workers_end_on_their_own(home: Path) -> None:
    """One failing worker fails only itself; each worker has its own start and end."""
    _ok(home, "job", "create", "-f", str(EXAMPLES / "lab-sweep.yaml"), "-y")
    sweep = _wait_state(home, "lab-sweep", {"succeeded", "failed"}, timeout=TIMEOUT_S)
    assert sweep["reason"] == "1 of 4 workers failed: worker 1: exited with code 1", sweep["reason"]
    assert [w["state"] for w in sweep["workers"]] == ["succeeded", "failed", "succeeded", "succeeded"]
    assert len({w["node"] for w in sweep["workers"]}) == 2  # packed: two 1-GPU workers a node
    assert all(w["started_at"] and w["ended_at"] for w in sweep["workers"]), sweep["workers"]
    by_index = {w["index"]: w for w in sweep["workers"]}
    assert by_index[1]["ended_at"] < by_index[3]["ended_at"]  # it ended on its own, the others ran on


def _task_roles_find_each_other(home: Path, addresses: dict[str, str]) -> None:
    """OpenPAI's task roles: a CPU-only parameter server beside one-GPU workers."""
    _ok(home, "job", "create", "-f", str(EXAMPLES / "lab-openpai-ps.json"), "-y")
    pai = _wait_state(home, "lab-ps-workers", {"succeeded", "failed"}, timeout=TIMEOUT_S)
    assert pai["state"] == "succeeded", pai["reason"]
    assert [(w["group"], w["gpu_count"]) for w in pai["workers"]] == [("ps", 0), ("worker", 1), ("worker", 1)]
    ps_at = f"{addresses[pai['workers'][0]['node']]}:{pai['workers'][0]['port']}"
    workers_at = [addresses[w["node"]] for w in pai["workers"][1:]]
    assert _logs(home, "lab-ps-workers", 0) == [
        f"ps 0 of roles ps,worker, workers at {workers_at[0]} and {workers_at[1]}"
    ]
    assert _logs(home, "lab-ps-workers", 2)[0].startswith("worker 1 with GPU ")
    assert _logs(home, "lab-ps-workers", 2)[0].endswith(f", ps at {ps_at}")


def _serve_is_an_endpoint_and_never_is_refused(home: Path) -> None:
    """Launch's serve job is an endpoint; a gang the lab can never hold is refused."""
    _ok(home, "job", "create", "-f", str(EXAMPLES / "lab-launch-serve.yaml"), "-y")
    serve = _wait_state(home, "serve-lab", {"succeeded", "failed"}, timeout=TIMEOUT_S)
    assert (serve["type"], serve["state"]) == ("endpoint", "succeeded"), serve["reason"]
    # its workspace travelled with it: uploaded as a model, and the job ran in it
    served = _ok(home, "job", "logs", "serve-lab")
    assert served.startswith("serving from /opt/ml/models on port "), served

    # a gang of 5 x 2 GPUs: the lab's 4 nodes hold 8 GPUs in all, so it could never start
    never = home / "never.yaml"
    never.write_text(
        "name: never\ntype: training\nkind: gang\nresources: {gpu_types: [RTX A6000], gpu_count: 2}\n"
        "workers: [a, b, c, d, e]\n"
    )
    refused = provision(home, "job", "create", "-f", str(never), "-y")
    assert refused.returncode != 0
    assert refused.stderr.strip().splitlines()[-1] == (
        "error: Unplaceable: the gang's 5 workers need 10 GPUs in one region; the largest region for them, "
        "lab, has 8 in all: use fewer or smaller workers, make it an independent job, or add nodes to one "
        "region"
    ), refused.stderr


def _wait_workers_ended(home: Path, name: str) -> list[dict[str, object]]:
    """A failed gang's other workers end once their nodes report them stopped."""
    job = _wait_state(home, name, {"failed"})
    for _ in range(TIMEOUT_S * 2):
        job = _job(home, name)
        if all(w["state"] in ("succeeded", "failed", "stopped") for w in job["workers"]):
            return list(job["workers"])
        time.sleep(0.5)
    raise AssertionError(f"{name}'s workers did not all end: {job['workers']}")
