"""Several control-plane hosts on one PostgreSQL behind HAProxy (docs/control-plane.md "Several hosts"):
three `provision serve` hosts, each a network namespace of its own, Debian's HAProxy in a fourth, and the
fleet's minions in a fifth, all on one virtual LAN. The minions beat through HAProxy with the minion's own
client; TLS ends at the hosts, so the CA the minions pin is the hosts' own.

One host is killed (SIGKILL) while it holds minions' connections: every minion is answered by another host
within one beat interval, no beat the hosts recorded went unanswered twice over, none answered was lost,
and another host takes the reconcilers over."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet
from sqlalchemy import create_engine, text

from bench.bench_fleet_heartbeats import seed
from minion.join.client import ControlPlane, Enrollment
from provisioner.lab.haproxy import HaproxyConfig
from provisioner.lab.netns import Lab, Netns
from tests.fixtures.control_plane import PROVISION
from tests.fixtures.fleet import Beats, fleet_beats
from tests.fixtures.processes import stop

DOCS = Path(__file__).resolve().parents[2] / "docs"
LAN = "10.83.0"
LB = f"{LAN}.2"
PORT = 8443
HOSTS = (11, 12, 13)
BEAT_S = 2.0
NODES = 24


@dataclass
class Host:
    ns: Netns
    address: str
    home: Path
    proc: subprocess.Popen[bytes] | None = None


def _wait_tcp(address: str, port: int, timeout: float = 60) -> bool:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((address, port), timeout=1):
                return True
        except OSError:
            time.sleep(0.1)
    return False


def _healthz(url: str, ca: str) -> dict[str, Any]:
    cp = ControlPlane(Enrollment(url, None, ca_certificate=ca))
    try:
        return dict(cp.get("/healthz").json())
    finally:
        cp.close()


@pytest.fixture
def hosts(
    tmp_path: Path, postgres_cluster: Any
) -> Iterator[tuple[list[Host], Netns, str, str, list[tuple[str, str]]]]:
    """Three control-plane hosts and HAProxy, started; the minions' namespace, the CA, the store's URL and
    the seeded nodes."""
    url = postgres_cluster.create_database()
    nodes = [(n.node_id, n.credential) for n in seed(url, NODES, 1_000_000)]
    with Lab("so") as lab:
        lan = lab.lan(f"{LAN}.0/24")
        hosts = []
        for number in HOSTS:
            ns = lab.netns(f"cp{number}")
            hosts.append(Host(ns, lan.attach(ns, number, multicast_route=False), tmp_path / f"cp{number}"))
        balancer, minions = lab.netns("lb"), lab.netns("minions")
        lan.attach(balancer, 2, multicast_route=False)
        lan.attach(minions, 50, multicast_route=False)
        for ns in (*[h.ns for h in hosts], balancer, minions):
            ns.ip("link", "set", "lo", "up")
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("RIGBASE_")},
            "RIGBASE_HEARTBEAT_S": str(BEAT_S),
            "RIGBASE_QUOTE_EVERY": "10000019",  # the seeded counters reach no multiple of K: no quotes
        }
        first = hosts[0]
        first.home.mkdir(mode=0o700)
        # the key that seals stored secrets: made once for the deployment (a host makes its own lazily)
        (first.home / "secret.key").write_bytes(Fernet.generate_key())
        (first.home / "secret.key").chmod(0o600)
        try:
            for host in hosts:
                if host is not first:  # one deployment: the same CA and secret key on every host
                    (host.home / "tls").mkdir(parents=True, mode=0o700)
                    for name in ("ca.pem", "ca.key"):
                        shutil.copy2(first.home / "tls" / name, host.home / "tls" / name)
                    shutil.copy2(first.home / "secret.key", host.home / "secret.key")
                host.proc = host.ns.popen(
                    [
                        str(PROVISION),
                        "serve",
                        "--port",
                        str(PORT),
                        "--database",
                        postgres_cluster.socket_url(url),  # the store's Unix socket reaches every namespace
                        "--advertise",
                        LB,
                        "--advertise",
                        host.address,
                    ],
                    env={**env, "RIGBASE_HOME": str(host.home)},
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                assert host.ns.call(_wait_tcp, host.address, PORT), f"{host.address} never listened"
            ca_file = first.home / "tls" / "ca.pem"
            config = tmp_path / "haproxy.cfg"
            config.write_text(
                HaproxyConfig(
                    f"{LB}:{PORT}",
                    [f"{h.address}:{PORT}" for h in hosts],
                    str(ca_file),
                    "localhost",
                    heartbeat_s=BEAT_S,
                ).render()
            )
            check = subprocess.run(["haproxy", "-c", "-f", str(config)], capture_output=True, text=True)
            assert check.returncode == 0, check.stdout + check.stderr
            proxy = balancer.popen(
                ["haproxy", "-f", str(config), "-db"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            try:
                assert minions.call(_wait_tcp, LB, PORT)
                time.sleep(1)  # two health checks: every host UP
                yield hosts, minions, ca_file.read_text(), url, nodes
            finally:
                stop(proxy)
        finally:
            for host in hosts:
                if host.proc is not None and host.proc.poll() is None:
                    stop(host.proc)


def _beats_recorded(url: str, node_ids: list[str]) -> dict[str, int]:
    engine = create_engine(url)
    try:
        with engine.connect() as db:
            rows = db.execute(text("SELECT id, heartbeats FROM nodes")).all()
    finally:
        engine.dispose()
    return {node_id: count for node_id, count in rows if node_id in node_ids}


def test_a_killed_host_s_minions_are_answered_by_another_within_one_beat(
    hosts: tuple[list[Host], Netns, str, str, list[tuple[str, str]]],
) -> None:
    servers, minions, ca, url, nodes = hosts
    lb_url = f"https://{LB}:{PORT}"
    leader = next(
        h for h in servers if minions.call(_healthz, f"https://{h.address}:{PORT}", ca)["reconciler_leader"]
    )
    before = _beats_recorded(url, [n for n, _ in nodes])
    running: dict[str, list[Beats]] = {}
    fleet = threading.Thread(
        target=lambda: running.update(
            beats=minions.call(fleet_beats, lb_url, ca, nodes, BEAT_S, 14.0, timeout=60)
        )
    )
    fleet.start()
    time.sleep(5)  # every minion holds a connection, a third of them to each host
    assert leader.proc is not None
    killed_at = time.time()
    os.kill(leader.proc.pid, signal.SIGKILL)
    leader.proc.wait(10)
    fleet.join(70)
    beats = running["beats"]
    after = _beats_recorded(url, [n for n, _ in nodes])

    for (node_id, _), seen in zip(nodes, beats, strict=True):
        assert seen.answered and seen.answered[0] < killed_at, f"{node_id} beat nothing before the kill"
        late = [t for t in seen.answered if t > killed_at]
        # answered by another host within one interval (and the answer's own time)
        assert late and late[0] - killed_at < BEAT_S + 1.0, (node_id, late[:1], seen.failed)
        recorded = after[node_id] - before[node_id]
        # every answered beat was recorded once; a failed one at most once (cut off after its commit)
        assert len(seen.answered) <= recorded <= len(seen.answered) + len(seen.failed), (
            node_id,
            recorded,
            seen,
        )
    failed = sum(len(b.failed) for b in beats)
    assert failed <= NODES // len(HOSTS) + 1  # at most the killed host's own minions, once each

    survivors = [h for h in servers if h is not leader]
    deadline = time.monotonic() + 30
    leaders: list[Host] = []
    while time.monotonic() < deadline and not leaders:
        leaders = [
            h
            for h in survivors
            if minions.call(_healthz, f"https://{h.address}:{PORT}", ca)["reconciler_leader"]
        ]
        time.sleep(0.5)
    assert len(leaders) == 1, "no surviving host took the reconcilers over within 30 s"


def test_the_documented_haproxy_configuration_is_the_rendered_one() -> None:
    example = HaproxyConfig(
        "203.0.113.10:8470",
        ["10.0.0.11:8470", "10.0.0.12:8470", "10.0.0.13:8470"],
        "/etc/haproxy/rigbase-ca.pem",
        "localhost",
    )
    assert (DOCS / "examples" / "haproxy.cfg").read_text() == example.render()
    assert "timeout client 90s" in example.render()  # past the server's 75 s keep-alive at 30 s beats
    with pytest.raises(ValueError, match="at least one control-plane host"):
        HaproxyConfig("203.0.113.10:8470", [], "ca.pem", "localhost").render()
