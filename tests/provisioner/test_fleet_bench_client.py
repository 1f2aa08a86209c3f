"""The fleet benchmark's load client (bench/beat_client.py) against a real `provision serve` over TLS: its
figures are only as good as its HTTP, so it must get the same answers httpx does, keep a connection
across beats in keep-alive mode, and open one per beat in the mode that models a minion."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest

from bench.beat_client import CLIENTS, BeatError, StreamBeatClient, Target
from bench.bench_fleet_heartbeats import ACTUAL, seed
from tests.fixtures.control_plane import ControlPlane, start_control_plane


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ControlPlane, list[tuple[str, str]]]]:
    tmp = tmp_path_factory.mktemp("fleet-client")
    url = f"sqlite:///{tmp / 'rigbase.db'}"
    nodes = [(n.node_id, n.credential) for n in seed(url, 2, 1_000_000)]
    # the seeded beat counts (999,999) reach no multiple of K while they beat: no quote is asked for
    quiet = {"RIGBASE_QUOTE_EVERY": "10000019"}
    with start_control_plane(tmp / "home", url, seed_store=False, env=quiet) as cp:
        yield cp, nodes


def _beats(cp: ControlPlane, nodes: list[tuple[str, str]], client_name: str, keep_alive: bool) -> list[int]:
    """Three beats of each node through the client: the statuses, then (stream client only) how many
    connections it still holds."""

    async def go() -> list[int]:
        client = CLIENTS[client_name](Target(cp.url, cp.verify, 2, keep_alive=keep_alive))
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
    assert _beats(cp, nodes, client_name, keep_alive=True)[:6] == [200] * 6


def test_keep_alive_reuses_one_connection_and_per_beat_mode_keeps_none(
    served: tuple[ControlPlane, list[tuple[str, str]]],
) -> None:
    cp, nodes = served
    *statuses, still_open = _beats(cp, nodes, "streams", keep_alive=True)
    assert statuses == [200] * 6 and still_open == 1  # one beat at a time: one connection, reused
    *statuses, still_open = _beats(cp, nodes, "streams", keep_alive=False)
    assert statuses == [200] * 6 and still_open == 0  # Connection: close: the server closed each one


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
