"""Two control-plane hosts on one PostgreSQL (`serve --peer-address`, api/tunnel_relay.py): a job's URL
and `job connect` answer through the host that does not hold the node's tunnel, the node's stream
crossing from the host it dialled to the one that asked; each host's process is found in the store
(relay_peers), and a request without the deployment's relay token is refused at the peers' port."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import httpx
import pytest
import websocket
from cryptography.fernet import Fernet
from sqlalchemy import select

from provisioner.store.models import RelayPeer
from tests.fixtures.control_plane import free_port, start_control_plane
from tests.provisioner.test_job_urls import (
    Worker,
    endpoint,
    file_server,
    fleet_at,
    one_node,
    running,
    tunnel_of,
)
from tests.provisioner.test_workers import _through_connect

PEER = {"RIGBASE_PEER_ADDRESS": "127.0.0.1"}


def _homes(tmp_path: Path) -> tuple[Path, Path]:
    """Two homes of one deployment: the same secret key (the same CA comes from the test session)."""
    key = Fernet.generate_key()
    homes = tmp_path / "host-a", tmp_path / "host-b"
    for home in homes:
        home.mkdir(mode=0o700)
        (home / "secret.key").write_bytes(key)
        (home / "secret.key").chmod(0o600)
    return homes


def _peers(fleet: Any) -> dict[str, str]:
    with fleet.sessions.begin() as s:
        return {row.tag: row.url for row in s.scalars(select(RelayPeer))}


def test_a_jobs_url_answers_through_the_host_without_its_nodes_tunnel(
    tmp_path: Path, postgres_cluster: Any
) -> None:
    url = postgres_cluster.create_database()
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "index.html").write_text("served by the endpoint\n")
    home_a, home_b = _homes(tmp_path)
    with (
        fleet_at(home_a, free_port(), database_url=url, env=PEER) as fleet,
        start_control_plane(home_b, url, token=fleet.cp.token, env=PEER) as host_b,
        file_server(tmp_path / "site") as site,
    ):
        one_node(fleet)
        job = running(fleet, "n-1", endpoint("across-hosts", public=False))
        tunnel = tunnel_of(fleet, "n-1", Worker({job["id"]: site}))  # the node dialled host A
        try:
            peers = _peers(fleet)
            assert len(peers) == 2 and all(u.startswith("wss://127.0.0.1:") for u in peers.values()), peers
            auth = {"Authorization": f"Bearer {fleet.cp.token}"}
            with httpx.Client(verify=fleet.cp.verify, timeout=15) as client:
                for _ in range(10):  # through host B: asked of A over the peers' relay, the stream back
                    got = client.get(f"{host_b.url}/j/{job['id']}/", headers=auth)
                    assert (got.status_code, got.text) == (200, "served by the endpoint\n")
                shown = client.get(f"{host_b.url}/v1/jobs/{job['id']}/url", headers=auth).json()
                assert shown["connected"] is True, shown
            for _ in range(3):  # `job connect`'s byte stream, through B
                assert b"served by the endpoint" in _through_connect(host_b, job["id"])
        finally:
            tunnel.close()
        # the peers' port answers only the deployment's hosts
        other = next(iter(_peers(fleet).values()))
        context = ssl.create_default_context(cafile=str(fleet.cp.ca))
        with pytest.raises(websocket.WebSocketBadStatusException) as refused:
            websocket.create_connection(f"{other}/holds/x", sslopt={"context": context}, timeout=5)
        assert refused.value.status_code == 401
    with fleet.sessions.begin() as s:  # each process removed its row as it stopped
        assert not s.scalars(select(RelayPeer)).all()
