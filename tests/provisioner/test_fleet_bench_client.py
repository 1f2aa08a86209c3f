"""The fleet benchmark's load client (bench/beat_client.py) against a real `provision serve` over TLS: its
figures are only as good as its HTTP, so it must get the same answers httpx does, keep a connection
across beats, open one per beat when told to, and look on the wire exactly like a minion: the same
connections, the same resumed handshakes, the same bytes each way."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import pytest

from bench.beat_client import CLIENTS, BeatError, StreamBeatClient, Target
from bench.bench_fleet_heartbeats import ACTUAL, seed
from minion.join.client import ConnectionAge, Enrollment, beat_idle_s
from minion.join.client import ControlPlane as MinionControlPlane
from minion.join.tls_resume import ResumingContext, TlsCounts
from tests.fixtures.control_plane import ControlPlane, start_control_plane
from tests.fixtures.wire_meter import wire_meter


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ControlPlane, list[tuple[str, str]]]]:
    tmp = tmp_path_factory.mktemp("fleet-client")
    url = f"sqlite:///{tmp / 'rigbase.db'}"
    nodes = [(n.node_id, n.credential) for n in seed(url, 2, 1_000_000)]
    # the seeded beat counts (999,999) reach no multiple of K while they beat: no quote is asked for
    quiet = {"RIGBASE_QUOTE_EVERY": "10000019"}
    with start_control_plane(tmp / "home", url, seed_store=False, env=quiet) as cp:
        yield cp, nodes


def _beats(
    cp: ControlPlane, nodes: list[tuple[str, str]], client_name: str, reconnect_every: int
) -> list[int]:
    """Three beats of each node through the client: the statuses, then (stream client only) how many
    connections it still holds."""

    async def go() -> list[int]:
        client = CLIENTS[client_name](Target(cp.url, cp.verify, 2, reconnect_every=reconnect_every))
        statuses = []
        try:
            for _ in range(3):
                for node_id, credential in nodes:
                    status, body = await client.post(
                        f"/v1/nodes/{node_id}/heartbeat", {"version": 1, "actual": ACTUAL}, credential
                    )
                    assert json.loads(body)["state"] == "maintenance", body
                    statuses.append(status)
            if isinstance(client, StreamBeatClient):
                statuses.append(client.open)
        finally:
            await client.aclose()
        return statuses

    return asyncio.run(go())


@pytest.mark.parametrize("client_name", sorted(CLIENTS))
def test_both_clients_get_the_servers_answers(
    served: tuple[ControlPlane, list[tuple[str, str]]], client_name: str
) -> None:
    cp, nodes = served
    assert _beats(cp, nodes, client_name, reconnect_every=0)[:6] == [200] * 6


def test_a_kept_connection_is_reused_and_per_beat_mode_keeps_none(
    served: tuple[ControlPlane, list[tuple[str, str]]],
) -> None:
    cp, nodes = served
    *statuses, still_open = _beats(cp, nodes, "streams", reconnect_every=0)
    assert statuses == [200] * 6 and still_open == 1  # one beat at a time: one connection, reused
    *statuses, still_open = _beats(cp, nodes, "streams", reconnect_every=1)
    assert statuses == [200] * 6 and still_open == 0  # each dropped after its beat


def test_a_refused_credential_is_an_answer_and_a_dead_server_an_error(
    served: tuple[ControlPlane, list[tuple[str, str]]],
) -> None:
    cp, nodes = served

    async def go() -> tuple[int, str]:
        client = StreamBeatClient(Target(cp.url, cp.verify, 1))
        status, _ = await client.post(
            f"/v1/nodes/{nodes[0][0]}/heartbeat", {"version": 1, "actual": ACTUAL}, "x"
        )
        await client.aclose()
        # the discard port: nothing listens
        nowhere = StreamBeatClient(Target("https://127.0.0.1:9/", cp.verify, 1))
        with pytest.raises(BeatError) as refused:
            await nowhere.post("/v1/nodes/n/heartbeat", {}, "x")
        return status, str(refused.value)

    status, refused = asyncio.run(go())
    assert status == 401
    assert refused.startswith("connect:")


# A connection lifetime shorter than a beat (its ±25 % included): each connection carries two beats, the
# second asking the server to close it
LIFETIME_S, INTERVAL_S = 60.0, 100.0
CLOSE_NOTIFY = 5 + 2 + 1 + 16  # a TLS 1.3 alert record: header, alert, content type, AEAD tag


def _minion(
    url: str, ca: str, node: tuple[str, str], beats: int, idle_s: float, lifetime: bool = False
) -> TlsCounts:
    """`beats` heartbeats through the minion's own client, its connection kept `idle_s` between them;
    `lifetime`: a beat every INTERVAL_S on the connection's clock, each connection living LIFETIME_S."""
    cp = MinionControlPlane(Enrollment(url, None, ca_certificate=ca), idle_s=idle_s)
    now = [0.0]
    if lifetime:
        cp.age = ConnectionAge(LIFETIME_S, clock=lambda: now[0])
    try:
        for beat in range(beats):
            now[0] = beat * INTERVAL_S
            response = cp.post(f"/v1/nodes/{node[0]}/heartbeat", {"version": 1, "actual": ACTUAL}, node[1])
            assert response.status_code == 200, response.text
            time.sleep(0.01)  # past an idle time of 0
    finally:
        cp.close()
    return cp.tls.counts


def _bench(
    url: str, ca: str, node: tuple[str, str], beats: int, reconnect_every: int, lifetime: bool = False
) -> TlsCounts:
    context = ResumingContext(ca)
    target = Target(
        url,
        context,
        1,
        reconnect_every=reconnect_every,
        lifetime_s=LIFETIME_S if lifetime else 0,
        interval_s=INTERVAL_S,
    )

    async def go() -> None:
        client = StreamBeatClient(target)
        try:
            for _ in range(beats):
                status, body = await client.post(
                    f"/v1/nodes/{node[0]}/heartbeat", {"version": 1, "actual": ACTUAL}, node[1]
                )
                assert status == 200, body
        finally:
            await client.aclose()

    asyncio.run(go())
    return context.counts


@pytest.mark.parametrize(
    ("idle_s", "reconnect_every", "lifetime", "connections"),
    [(60.0, 0, False, 1), (0.0, 1, False, 4), (60.0, 0, True, 2)],
    ids=["kept", "per-beat", "lifetime"],
)
def test_on_the_wire_the_bench_client_is_a_minion(
    served: tuple[ControlPlane, list[tuple[str, str]]],
    idle_s: float,
    reconnect_every: int,
    lifetime: bool,
    connections: int,
) -> None:
    """Through one counting relay, the same node's beats from the minion's client and from the bench's:
    the same connections, the same resumed handshakes, and the same bytes in each direction on each
    connection (the hello and its ALPN, the request heads and bodies in their TLS records, the close).
    `lifetime`: each connection's second beat asks the server to close it (`Connection: close`)."""
    cp, nodes = served
    ca = cp.ca.read_text()
    port = int(cp.url.rsplit(":", 1)[1])
    with wire_meter(port) as meter:
        url = f"https://127.0.0.1:{meter.port}"
        minion_counts = _minion(url, ca, nodes[0], 4, idle_s, lifetime)
        minion_wire = meter.take()
        bench_counts = _bench(url, ca, nodes[0], 4, reconnect_every, lifetime)
        bench_wire = meter.take()
    assert minion_counts == bench_counts == TlsCounts(connections, connections - 1)
    assert len(minion_wire) == connections
    # a connection the server closed (its last beat asked it to): asyncio's TLS answers the server's
    # close_notify with its own, one 24-byte record, when it read it before the client let go; httpcore's
    # socket just closes
    answered = (0, CLOSE_NOTIFY) if lifetime else (0,)
    ups = zip(bench_wire, minion_wire, strict=True)
    assert all(b.up - m.up in answered for b, m in ups), (bench_wire, minion_wire)
    # the server's side: the same but for its ECDSA signature in a full handshake, 70 to 72 bytes in DER
    assert abs(bench_wire[0].down - minion_wire[0].down) <= 2
    assert [c.down for c in bench_wire[1:]] == [c.down for c in minion_wire[1:]]
    if connections > 1:  # a resumed handshake carries no certificate: the server sends less
        assert minion_wire[1].down < minion_wire[0].down


def test_a_minion_keeps_its_connection_between_beats_longer_than_uvicorns_default(
    served: tuple[ControlPlane, list[tuple[str, str]]],
) -> None:
    """uvicorn closes a connection idle for 5 s unless told otherwise, and httpx drops one idle for 5 s:
    a minion beating every 30 s opened a new TLS connection for every beat. Now both keep it past the beat
    (serve: keep_alive_s, the minion: beat_idle_s), so 6 s apart two beats share one connection."""
    cp, nodes = served
    minion = MinionControlPlane(Enrollment(cp.url, None, ca_certificate=cp.ca.read_text()))
    minion.keep_idle(beat_idle_s(30))
    try:
        for pause in (6.0, 0.0):
            response = minion.post(
                f"/v1/nodes/{nodes[1][0]}/heartbeat", {"version": 1, "actual": ACTUAL}, nodes[1][1]
            )
            assert response.status_code == 200, response.text
            time.sleep(pause)
    finally:
        minion.close()
    assert minion.tls.counts == TlsCounts(connections=1, resumed=0)
