"""Several control-plane hosts on one PostgreSQL behind HAProxy (docs/control-plane.md "Several hosts"):
three `provision serve` hosts, each a network namespace of its own, Debian's HAProxy in a fourth, and the
fleet's minions in a fifth, all on one virtual LAN. The minions beat through HAProxy with the minion's own
client; TLS ends at the hosts, so the CA the minions pin is the hosts' own.

One host is killed (SIGKILL) while it holds minions' connections: every minion is answered by another host
within one beat interval, no beat the hosts recorded went unanswered twice over, none answered was lost,
and another host takes the reconcilers over. Started again, the host gets its share of the fleet's
connections back within a connection's lifetime (minion/join/client.py ConnectionAge)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from bench.bench_fleet_heartbeats import seed
from minion.join.client import ControlPlane, Enrollment
from provisioner.lab.haproxy import HaproxyConfig
from tests.fixtures.fleet import Beats, fleet_beats
from tests.fixtures.scale_out import LB, Deployment, Host, control_plane_hosts

DOCS = Path(__file__).resolve().parents[2] / "docs"
BEAT_S = 2.0
NODES = 24
LIFETIME_S = 6.0  # a minion's connection, ± 25 %: at most 7.5 s


def _healthz(url: str, ca: str) -> dict[str, Any]:
    cp = ControlPlane(Enrollment(url, None, ca_certificate=ca))
    try:
        return dict(cp.get("/healthz").json())
    finally:
        cp.close()


@pytest.fixture
def hosts(tmp_path: Path, postgres_cluster: Any) -> Iterator[tuple[Deployment, str, list[tuple[str, str]]]]:
    """Three control-plane hosts and HAProxy, started; the store's URL and the seeded nodes."""
    url = postgres_cluster.create_database()
    nodes = [(n.node_id, n.credential) for n in seed(url, NODES, 1_000_000)]
    # the seeded counters reach no multiple of K: no quotes
    quiet = {"RIGBASE_QUOTE_EVERY": "10000019"}
    with control_plane_hosts(tmp_path, postgres_cluster, url, 3, quiet, BEAT_S) as deployment:
        yield deployment, url, nodes


def _beats_recorded(url: str, node_ids: list[str]) -> dict[str, int]:
    engine = create_engine(url)
    try:
        with engine.connect() as db:
            rows = db.execute(text("SELECT id, heartbeats FROM nodes")).all()
    finally:
        engine.dispose()
    return {node_id: count for node_id, count in rows if node_id in node_ids}


def test_a_killed_host_s_minions_move_within_one_beat_and_come_back_after_its_restart(
    hosts: tuple[Deployment, str, list[tuple[str, str]]],
) -> None:
    deployment, url, nodes = hosts
    servers, minions, ca, lb_url = deployment.hosts, deployment.minions, deployment.ca, deployment.url
    leader = next(h for h in servers if minions.call(_healthz, h.url, ca)["reconciler_leader"])
    before = _beats_recorded(url, [n for n, _ in nodes])
    running: dict[str, list[Beats]] = {}
    fleet = threading.Thread(
        target=lambda: running.update(
            beats=minions.call(fleet_beats, lb_url, ca, nodes, BEAT_S, 32.0, LIFETIME_S, timeout=90)
        )
    )
    fleet.start()
    time.sleep(5)  # every minion holds a connection, a third of them to each host
    assert leader.proc is not None
    killed_at = time.time()
    os.kill(leader.proc.pid, signal.SIGKILL)
    leader.proc.wait(10)
    survivors = [h for h in servers if h is not leader]
    deadline = time.monotonic() + 30
    leaders: list[Host] = []
    while time.monotonic() < deadline and not leaders:
        leaders = [h for h in survivors if minions.call(_healthz, h.url, ca)["reconciler_leader"]]
        time.sleep(0.5)

    leader.start()  # the same host again: HAProxy's checks see it up within a second or two
    # every connection made before it was up has lived out its lifetime and its next beat has come
    time.sleep(1.25 * LIFETIME_S + 2 * BEAT_S + 2)
    held = leader.connections_from(LB)
    others = [h.connections_from(LB) for h in servers if h is not leader]
    fleet.join(90)
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
    assert failed <= NODES // len(servers) + 1  # at most the killed host's own minions, once each

    # round robin over three hosts gives it about a third of the 24; kept forever, it would have none
    assert held >= NODES // len(servers) // 2, (held, others)
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
