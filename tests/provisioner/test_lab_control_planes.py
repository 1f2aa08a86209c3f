"""`provision lab up --control-planes N` (provisioner/lab/control_planes.py): the lab's control plane as
several `provision serve` hosts, each in its own namespace, on one PostgreSQL behind HAProxy. The node joins
through the balancer, and an endpoint's URL answers through whichever host the balancer picks (the hosts
relay the node's tunnel to each other). Two of the three hosts killed under it: the node beats on, its
minion's tunnel dials the host that is left, the URL answers again and the operator's commands are
answered; `lab up` again restarts only those hosts; `lab down` leaves no host, balancer or cluster."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from provisioner.lab import control_planes
from provisioner.lab.haproxy import HaproxyConfig
from provisioner.lab.topology import NAME_PATTERN, LabPlan
from tests.provisioner.test_lab import cached_lab_home, lab_home, lab_namespaces, provision, rootfs_cache
from tests.provisioner.test_lab_job_urls import _client
from tests.provisioner.test_lab_jobs import EXAMPLES, _job, _ok

__all__ = ["cached_lab_home", "lab_home", "rootfs_cache"]  # the fixtures, shared with test_lab


def test_a_plan_of_three_control_planes_names_their_hosts_and_one_is_none() -> None:
    plan = LabPlan(nodes=1, control_planes=3)
    hosts = [(h.name, h.netns, h.address) for h in plan.host_plans()]
    assert hosts == [
        ("host1", "rigbase-lab-host1", "10.77.0.61"),
        ("host2", "rigbase-lab-host2", "10.77.0.62"),
        ("host3", "rigbase-lab-host3", "10.77.0.63"),
    ]
    assert all(NAME_PATTERN.match(n) for n in plan.namespaces()) and "rigbase-lab-host3" in plan.namespaces()
    assert LabPlan(nodes=1).host_plans() == []  # one control plane: the single serve process, no hosts
    for bad in (0, 6):
        with pytest.raises(ValueError, match="--control-planes .* out of range"):
            LabPlan(control_planes=bad)


def test_the_balancer_also_listens_on_an_inherited_socket() -> None:
    config = HaproxyConfig(
        "10.77.0.2:8470", ["10.77.0.61:8470"], "/ca.pem", "localhost", also_listen=["fd@7"]
    )
    assert "    bind 10.77.0.2:8470\n    bind fd@7\n" in config.render()


@pytest.mark.parametrize("count", ["0", "6", "three"])
def test_bad_control_plane_counts_are_refused_before_anything_is_made(tmp_path: Path, count: str) -> None:
    home = tmp_path / "home"
    result = provision(home, "lab", "up", "--control-planes", count)
    assert result.returncode == 2, result
    assert not (home / "lab").exists() and not control_planes.PG_DIR.exists()


def _report(home: Path) -> dict[str, Any]:
    status = provision(home, "lab", "status", "--json")
    assert status.returncode == 0, status.stderr
    report: dict[str, Any] = json.loads(status.stdout)
    return report


def _hosts(report: dict[str, Any]) -> dict[str, int]:
    return {p["node"]: p["pid"] for p in report["processes"] if p["kind"] == "serve" and p["alive"]}


def _last_beat(home: Path) -> str:
    shown = provision(home, "node", "show", "node-1", "-o", "json")
    assert shown.returncode == 0, shown.stderr
    return str(json.loads(shown.stdout)["last_heartbeat_at"])


def _an_endpoint_outlives_two_hosts(home: Path, hosts: dict[str, int]) -> None:
    """An endpoint's URL answers through any host; with host1 and host2 killed, the node beats on through
    host3, its minion's tunnel dials host3 (whichever host it held before), and the URL answers again."""
    # an endpoint: its URL answers through any host, whichever holds the node's tunnel
    _ok(home, "node", "maintenance", "node-1", "off")
    _ok(home, "job", "create", "-f", str(EXAMPLES / "lab-endpoint.yaml"), "-y")
    deadline = time.monotonic() + 120
    while (job := _job(home, "hello-endpoint"))["state"] != "running":
        assert job["state"] in ("waiting", "starting") and time.monotonic() < deadline, job
        time.sleep(0.5)
    config, client = _client(home)
    url, auth = f"{config['url']}/j/{job['id']}/", {"Authorization": f"Bearer {config['token']}"}
    with client:
        for _ in range(10):  # each on a new connection: HAProxy spreads them over the hosts
            answer = client.get(url, headers=auth | {"Connection": "close"})
            assert (answer.status_code, answer.text) == (200, "hello from hello-endpoint\n"), answer.text

        # two of the three hosts killed under the fleet: the node beats on through the third, its tunnel
        # dials the third, the URL answers again, the CLI is answered
        for name in ("host1", "host2"):
            os.kill(hosts[name], signal.SIGKILL)
        before, deadline = _last_beat(home), time.monotonic() + 30
        while _last_beat(home) == before:
            assert time.monotonic() < deadline, "node-1 was not heard from after two hosts were killed"
            time.sleep(0.5)
        back, deadline = None, time.monotonic() + 60
        while back is None or back.status_code != 200:
            assert time.monotonic() < deadline, f"the URL did not answer again: {back and back.text}"
            time.sleep(1)
            back = client.get(url, headers=auth | {"Connection": "close"})
        assert back.text == "hello from hello-endpoint\n"


def test_three_control_planes_outlive_two_hosts_killed_and_down_leaves_nothing(cached_lab_home: Path) -> None:
    home = cached_lab_home
    up = provision(home, "lab", "up", "--nodes", "1", "--control-planes", "3", "--json", timeout=600)
    assert up.returncode == 0, up.stderr[-3000:]
    assert [(n["name"], n["state"]) for n in json.loads(up.stdout)["nodes"]] == [("node-1", "maintenance")]
    report = _report(home)
    assert report["control_planes"] == 3 and report["control_plane_reachable"], report
    kinds = sorted(p["kind"] for p in report["processes"] if p["alive"])  # before any job: no container
    assert kinds == ["haproxy", "minion", "postgres", "serve", "serve", "serve", "swtpm"], report["processes"]
    # the operator's URL is the balancer's loopback socket; the fleet's status reads PostgreSQL
    client = json.loads((home / "client.json").read_text())
    assert client["url"] == report["host_url"] and client["url"].startswith("https://127.0.0.1:")
    status = provision(home, "status", "--json")
    assert status.returncode == 0, status.stderr
    (region,) = json.loads(status.stdout)["regions"]
    assert region["by_state"] == {"maintenance": 1}, region

    hosts = _hosts(report)
    _an_endpoint_outlives_two_hosts(home, hosts)
    listed = provision(home, "node", "list", "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout)[0]["online"] is True, listed

    # `lab up` again restarts what is down and nothing else; another count is refused in one line
    again = provision(home, "lab", "up", "--nodes", "1", "--control-planes", "3", timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    after = _hosts(_report(home))
    assert after["host1"] != hosts["host1"] and after["host2"] != hosts["host2"], (hosts, after)
    assert after["host3"] == hosts["host3"]
    other = provision(home, "lab", "up", "--nodes", "1", "--control-planes", "2")
    assert other.returncode == 1 and "--control-planes 3" in other.stderr, other.stderr
    assert other.stderr.strip().count("\n") == 0

    down = provision(home, "lab", "down", "--yes", timeout=300)
    assert down.returncode == 0, down.stderr
    assert not lab_namespaces() and not control_planes.PG_DIR.exists()
    for pid in [*after.values(), *(p["pid"] for p in report["processes"] if p["kind"] in ("haproxy",))]:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
