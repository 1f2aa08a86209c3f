"""Control plane → heartbeat desired state → minion.desired.apply → ReservationAgent in a node's network
namespace → a zeroconf peer on the same virtual LAN resolves HOST.local. Unassign sends goodbyes (the
peer's cache drops the name), a move reaches the peer within 2 s, and the shutdown hook withdraws the
name. A job's reservation does the same with no operator step: published by the node running the job's
worker 0 while it runs, withdrawn when the job is stopped. Real store (services), real minion handler, real
zeroconf on both sides; no mocks."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from contracts.jobspec import JobSpec
from provisioner.domain.roles import Principal, Role
from provisioner.domain.states import NodeState
from provisioner.lab.netns import Netns
from provisioner.services import beat
from provisioner.services.fleet import nodes
from provisioner.services.jobs import jobs
from provisioner.services.regions import providers, regions, reservations
from provisioner.store.account_models import Account
from provisioner.store.engine import make_engine, make_sessionmaker
from provisioner.store.migrate import upgrade
from tests.fixtures.netns import REPO, MdnsLan
from tests.fixtures.postgres import seed_sqlite

ACTOR = "operator:test"
MOVE_WITHIN_S = 2.0  # a resolver on the LAN sees the new address within 2 s


class Minion:
    """tests/minion/desired_driver.py in a node namespace: one heartbeat per `beat`."""

    def __init__(self, ns: Netns) -> None:
        self.proc = ns.popen(
            [sys.executable, "-m", "tests.minion.desired_driver"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        ready = self._read()
        assert ready["ready"] and not ready["zeroconf_loaded"], ready  # import-light until needed

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"minion driver exited with {self.proc.wait()}")
        return json.loads(line)

    def send(self, msg: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def beat(self, desired: dict[str, Any]) -> dict[str, Any]:
        return self.send({"desired": desired})["actual"]

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.send({"op": "close"})["closed"]
            self.proc.wait(10)


class Resolver:
    """`python -m minion.reservations resolve` on the peer, started BEFORE a change so its cache holds
    the old answer: only a goodbye (or the new announcement) changes what it sees within seconds."""

    def __init__(self, ns: Netns, lan_address: str, host: str, timeout: float = 8) -> None:
        self.proc = ns.popen(
            [
                sys.executable,
                "-m",
                "minion.reservations",
                "resolve",
                host,
                "--lan-address",
                lan_address,
                "--timeout",
                str(timeout),
            ],
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        assert self._line()["ready"]

    def _line(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("resolver ended without the expected answer")
        return json.loads(line)

    def wait_for(self, addresses: list[str]) -> float:
        """CLOCK_MONOTONIC time (system-wide, comparable across namespaces) of that answer."""
        while True:
            line = self._line()
            if line.get("addresses") == addresses:
                return float(line["t"])

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def sessions(tmp_path: Path) -> Iterator[Any]:
    seed_sqlite(tmp_path / "rigbase.db")
    url = f"sqlite:///{tmp_path / 'rigbase.db'}"
    engine = make_engine(url)
    upgrade(url, engine)
    factory = make_sessionmaker(engine)
    with factory.begin() as s:
        providers.enable(s, "physical", {}, actor=ACTOR)
        regions.create(s, "lab-1", provider="physical", actor=ACTOR)
        nodes.add(s, "node-a", region="lab-1", minion_id="a" * 32, upnp=False, actor=ACTOR)
        nodes.add(s, "node-b", region="lab-1", minion_id="b" * 32, upnp=False, actor=ACTOR)
        reservations.add(s, "nb", region="lab-1", hostname="jupyter", port=8888, actor=ACTOR)
    yield factory
    engine.dispose()


def heartbeat(factory: Any, minion: Minion, node_name: str) -> dict[str, Any]:
    """What the heartbeat route does for one beat: desired out, the minion applies, actual back in."""
    with factory.begin() as s:
        desired = beat.desired_for(s, nodes.get(s, node_name))
    actual = minion.beat(json.loads(json.dumps(desired)))  # through JSON, as on the wire
    with factory.begin() as s:
        beat.record_actual(s, nodes.get(s, node_name), actual)
    return actual


def _operator(factory: Any, fn: Any, **kwargs: Any) -> None:
    with factory.begin() as s:
        fn(s, "nb", actor=ACTOR, **kwargs)


def _shown(factory: Any) -> reservations.Reservation:
    s: Session
    with factory() as s:
        return reservations.get(s, "nb")


def test_assign_unassign_move_and_shutdown_reach_a_lan_peer(mdns_lan: MdnsLan, sessions: Any) -> None:
    lan = mdns_lan
    a, b = Minion(lan.node_a), Minion(lan.node_b)
    resolvers: list[Resolver] = []
    try:
        assert heartbeat(sessions, a, "node-a")["reservations"] == []  # nothing assigned: no agent started

        _operator(sessions, reservations.assign, node="node-a")
        [status] = heartbeat(sessions, a, "node-a")["reservations"]
        assert (status["state"], status["address"]) == ("published", lan.addr_a), status
        rsv = _shown(sessions)
        assert (rsv.state, rsv.node.name, rsv.actual_state, rsv.address) == (
            "assigned",
            "node-a",
            "published",
            lan.addr_a,
        )

        peer = Resolver(lan.peer, lan.addr_peer, "jupyter")
        resolvers.append(peer)
        peer.wait_for([lan.addr_a])
        _operator(sessions, reservations.unassign)
        t0 = time.monotonic()
        assert heartbeat(sessions, a, "node-a")["reservations"] == []
        # the peer had the name cached for its 120 s TTL; only a goodbye makes it go within ~1 s
        assert peer.wait_for([]) - t0 < MOVE_WITHIN_S

        _operator(sessions, reservations.assign, node="node-a")
        heartbeat(sessions, a, "node-a")
        peer = Resolver(lan.peer, lan.addr_peer, "jupyter")
        resolvers.append(peer)
        peer.wait_for([lan.addr_a])
        _operator(sessions, reservations.assign, node="node-b")  # move
        t0 = time.monotonic()
        assert heartbeat(sessions, a, "node-a")["reservations"] == []
        [status] = heartbeat(sessions, b, "node-b")["reservations"]
        assert status["state"] == "published", status  # A's goodbye is not mistaken for a rival
        moved = peer.wait_for([lan.addr_b]) - t0
        assert moved < MOVE_WITHIN_S, f"the peer saw the move after {moved:.2f} s"
        assert (_shown(sessions).node.name, _shown(sessions).address) == ("node-b", lan.addr_b)

        peer = Resolver(lan.peer, lan.addr_peer, "jupyter")
        resolvers.append(peer)
        peer.wait_for([lan.addr_b])
        t0 = time.monotonic()
        b.close()  # minion stops: minion.desired.shutdown() runs the reservation agent's goodbyes
        assert peer.wait_for([]) - t0 < MOVE_WITHIN_S
    finally:
        for r in resolvers:
            r.stop()
        a.close()
        b.close()


def _activate(factory: Any, name: str) -> None:
    """The node as the join leaves it: active, with a CPU-only inventory (jobs need one to be placed)."""
    with factory.begin() as s:
        node = nodes.get(s, name)
        for state in (NodeState.ENROLLING, NodeState.PROVISIONING, NodeState.ACTIVE):
            nodes.transition(s, node, state, actor="minion:test")
        inventory = {
            "hostname": name,
            "cpu": {"physical_cores": 8, "threads": 16},
            "memory_total_bytes": 16 * 2**30,
            "tpm": {"present": True},
            "gpus": [],
        }
        nodes.record_report(s, node, inventory=inventory, requirements={"ok": True, "rules": []})


def test_a_jobs_reservation_resolves_while_it_runs_and_goes_when_it_stops(
    mdns_lan: MdnsLan, sessions: Any
) -> None:
    lan = mdns_lan
    _activate(sessions, "node-a")
    with sessions.begin() as s:
        account = s.scalar(select(Account).where(Account.name == "default"))
        assert account is not None
        root = Principal(actor=ACTOR, account_id=account.id, role=Role.ADMIN, root=account.root)
        spec = {
            "name": "serve-nb",
            "type": "endpoint",
            "resources": {"gpu_count": 0, "cpu_count": 4},
            "workers": ["python -m http.server 8888"],
            "environment": {"image": "localhost/rigbase-job:test"},
            "reservation": "nb",
        }
        job = jobs.create(s, root, JobSpec.model_validate(spec)).job
        assert job is not None and job.state == "starting" and job.node_id == nodes.get(s, "node-a").id
    a = Minion(lan.node_a)
    peer: Resolver | None = None
    try:
        [status] = heartbeat(sessions, a, "node-a")["reservations"]  # the job's node publishes it
        assert (status["state"], status["address"], status["upnp"]) == ("published", lan.addr_a, "lan-only")
        with sessions() as s:
            rsv = reservations.get(s, "nb")
            serving = reservations.serving_jobs(s, [rsv])[rsv.id]
            assert (serving.job.name, serving.node and serving.node.name) == ("serve-nb", "node-a")
            assert reservations.actual_is_current(rsv, serving) and rsv.address == lan.addr_a
        peer = Resolver(lan.peer, lan.addr_peer, "jupyter")
        peer.wait_for([lan.addr_a])  # resolves from the client's namespace while the job runs
        with sessions.begin() as s:
            jobs.stop(s, root, "serve-nb")
        t0 = time.monotonic()
        assert heartbeat(sessions, a, "node-a")["reservations"] == []
        assert peer.wait_for([]) - t0 < MOVE_WITHIN_S  # withdrawn (goodbye) when the job ends
    finally:
        if peer is not None:
            peer.stop()
        a.close()
