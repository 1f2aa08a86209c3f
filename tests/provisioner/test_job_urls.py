"""A notebook's and an endpoint's URL through the node's outbound tunnel (docs/job-urls.md), against a real
`provision serve`, the minion's own Tunnel (websockets) dialing out with the node's credential, and real
servers behind it: Python's HTTP server for an endpoint, JupyterLab for a notebook, and a TCP server for
`provision job connect`.

What no test here does: run the worker's container. The minion's side of a served worker (readiness,
JupyterLab in the container) is tests/provisioner/test_lab_job_urls.py."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import re
import secrets
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import websocket

from contracts.jobs import ServeBinding
from contracts.tunnel import StreamOpen
from minion.jobs.served import notebook_idle_s
from minion.jobs.tunnel import NotHere, Tunnel
from provisioner.services.common.runtime import Runtime, attach
from provisioner.settings import Settings
from provisioner.store.engine import make_engine, make_sessionmaker
from tests.fixtures.control_plane import PROVISION, free_port, start_control_plane
from tests.fixtures.processes import stop, until_ready
from tests.provisioner.test_console import browser, sign_in
from tests.provisioner.test_jobs_api import Fleet, _add_node, inventory, report

JUPYTER = shutil.which("jupyter", path=str(Path(sys.executable).parent))


@dataclass
class Worker:
    """What the tunnel's dial reaches: job → local port (the worker's container, here a local server)."""

    ports: dict[str, int]

    def dial(self, opening: StreamOpen) -> tuple[str, int]:
        if opening.job_id not in self.ports:
            raise NotHere(f"worker {opening.worker} of job {opening.job_id} does not run on this node")
        return "127.0.0.1", self.ports[opening.job_id] if opening.port in (8888, 8000) else opening.port


class Files(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def file_server(root: Path) -> Iterator[int]:
    handler = lambda *a, **k: Files(*a, directory=str(root), **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()


@contextmanager
def fleet_at(
    home: Path,
    port: int,
    per_source: int = 40,
    database_url: str | None = None,
    workers: int = 1,
    env: dict[str, str] | None = None,
) -> Iterator[Fleet]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RIGBASE_QUOTE_EVERY", "100000")
        limit = {"RIGBASE_TUNNEL_STREAMS_PER_SOURCE": str(per_source), **(env or {})}
        extra = ("--workers", str(workers)) if workers > 1 else ()
        with start_control_plane(home, database_url, port=port, env=limit, extra_args=extra) as cp:
            engine = make_engine(cp.database_url)
            settings = Settings(home=cp.home, database_url=cp.database_url)
            yield Fleet(cp, attach(make_sessionmaker(engine), Runtime.from_settings(settings)))
            engine.dispose()


def one_node(fleet: Fleet) -> None:
    """Region `lab` with the active node n-1."""
    with fleet.http() as http:
        assert http.post("/v1/providers", json={"kind": "physical"}).status_code == 201
        assert http.post("/v1/regions", json={"name": "lab", "provider": "physical"}).status_code == 201
        _add_node(fleet, http, "n-1", "lab", inventory([], threads=64))


def tunnel_of(fleet: Fleet, node: str, worker: Worker) -> Tunnel:
    ident = {"node_id": fleet.node_ids[node], "node_credential": fleet.credentials[node]}
    tunnel = Tunnel(
        fleet.cp.url,
        lambda: ident,
        worker.dial,
        ssl.create_default_context(cadata=fleet.cp.ca.read_text()),
    )
    tunnel.start()
    assert tunnel.connected.wait(20), "the tunnel never connected"
    return tunnel


def running(fleet: Fleet, node: str, body: dict[str, Any], project: str | None = None) -> dict[str, Any]:
    """Create the job and report its worker running from `node` (as its minion would)."""
    with fleet.http() as http:
        made = http.post("/v1/jobs", json={"spec": body, "project": project})
        assert made.status_code == 201, made.text
        job = made.json()
    jobs = fleet.heartbeat(node)
    mine = [a for a in jobs["workers"] if a["job_id"] == job["id"]]
    assert mine, jobs
    fleet.heartbeat(node, [report(a, "running") for a in jobs["workers"]])
    return dict(job)


def endpoint(name: str, public: bool) -> dict[str, Any]:
    return {
        "name": name,
        "type": "endpoint",
        "resources": {"gpu_count": 0, "cpu_count": 4},
        "endpoint": {"port": 8000, "start_command": "python3 -m http.server 8000", "public": public},
    }


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("job-urls")
    site = root / "site"
    site.mkdir()
    (site / "index.html").write_text("<h1>served through the tunnel</h1>\n")
    (site / "big.bin").write_bytes(secrets.token_bytes(8 * 2**20))
    port = free_port()
    with file_server(site) as http_port, fleet_at(root / "home", port) as fleet:
        with fleet.http() as http:
            for path, body in [
                ("/v1/providers", {"kind": "physical"}),
                ("/v1/regions", {"name": "lab", "provider": "physical"}),
                ("/v1/accounts", {"name": "other"}),
            ]:
                assert http.post(path, json=body).status_code == 201
            _add_node(fleet, http, "n-1", "lab", inventory([], threads=64))
            token = http.post("/v1/operator-tokens", json={"name": "other-admin", "account": "other"})
            fleet.other_token = token.json()["token"]
        worker = Worker({})
        tunnel = tunnel_of(fleet, "n-1", worker)
        try:
            yield {"fleet": fleet, "worker": worker, "tunnel": tunnel, "site": site, "http_port": http_port}
        finally:
            tunnel.close()


def test_a_public_endpoint_answers_through_its_url_and_a_private_one_wants_a_token(
    world: dict[str, Any],
) -> None:
    fleet: Fleet = world["fleet"]
    public = running(fleet, "n-1", endpoint("site", public=True))
    private = running(fleet, "n-1", endpoint("private-site", public=False))
    world["worker"].ports.update({public["id"]: world["http_port"], private["id"]: world["http_port"]})
    url = f"{fleet.cp.url}/j/{public['id']}/"
    answer = httpx.get(url, verify=fleet.cp.verify)  # no token at all
    assert answer.status_code == 200 and "served through the tunnel" in answer.text
    assert "sandbox" in answer.headers["content-security-policy"]  # never the console's origin
    big = httpx.get(url + "big.bin", verify=fleet.cp.verify)
    assert (
        hashlib.sha256(big.content).digest()
        == hashlib.sha256((world["site"] / "big.bin").read_bytes()).digest()
    )

    private_url = f"{fleet.cp.url}/j/{private['id']}/index.html"
    refused = httpx.get(private_url, verify=fleet.cp.verify)
    assert refused.status_code == 401 and "token" in refused.json()["message"]
    with fleet.http() as http:  # the account's token passes
        assert http.get(private_url).status_code == 200
    with fleet.http(fleet.other_token) as http:  # another account's is told nothing exists
        assert http.get(private_url).status_code == 404
    bad = httpx.get(private_url, headers={"Authorization": "Bearer rbo_" + "x" * 43}, verify=fleet.cp.verify)
    assert bad.status_code == 401

    shown = fleet.cp.provision("job", "url", "site", "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["url"] == url and json.loads(shown.stdout)["ready"] is True
    assert url in fleet.cp.provision("job", "show", "site").stdout

    with fleet.http() as http:
        assert http.post(f"/v1/jobs/{public['id']}/stop").status_code == 200
    fleet.heartbeat("n-1", [report(a, "stopped", exit_code=0) for a in fleet.heartbeat("n-1")["workers"]])
    ended = httpx.get(url, verify=fleet.cp.verify)
    assert ended.status_code == 410 and "stopped" in ended.json()["message"], ended.text


def test_a_worker_whose_server_is_not_there_is_refused_with_the_reason(world: dict[str, Any]) -> None:
    fleet: Fleet = world["fleet"]
    job = running(fleet, "n-1", endpoint("nothing-listens", public=True))
    world["worker"].ports[job["id"]] = free_port()  # nothing listens there
    answer = httpx.get(f"{fleet.cp.url}/j/{job['id']}/", verify=fleet.cp.verify)
    assert answer.status_code == 502 and "nothing answers" in answer.json()["message"], answer.text
    not_here = running(fleet, "n-1", endpoint("not-on-this-node", public=True))
    answer = httpx.get(f"{fleet.cp.url}/j/{not_here['id']}/", verify=fleet.cp.verify)
    assert answer.status_code == 502 and "does not run on this node" in answer.json()["message"]


def test_connections_beyond_a_sources_limit_are_refused_and_others_go_on(world: dict[str, Any]) -> None:
    fleet: Fleet = world["fleet"]
    job = running(fleet, "n-1", endpoint("busy", public=True))
    world["worker"].ports[job["id"]] = world["http_port"]
    url = f"{fleet.cp.url}/j/{job['id']}/big.bin"
    statuses: list[int] = []
    lock = threading.Lock()

    def fetch() -> None:
        with httpx.Client(verify=fleet.cp.verify, timeout=60) as c, c.stream("GET", url) as r:
            with lock:
                statuses.append(r.status_code)
            time.sleep(1.0)  # hold the connection open
            for _ in r.iter_bytes():
                pass

    threads = [threading.Thread(target=fetch) for _ in range(60)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert statuses.count(200) >= 1 and 429 in statuses, statuses
    assert httpx.get(url, verify=fleet.cp.verify).status_code == 200  # the limit let go
    for _ in range(45):  # clients that go away mid-body give their place back too (limit: 40)
        with httpx.Client(verify=fleet.cp.verify, timeout=60) as c, c.stream("GET", url) as r:
            assert r.status_code == 200
            next(r.iter_raw(65536))
    time.sleep(1.0)
    assert httpx.get(url, verify=fleet.cp.verify).status_code == 200


def test_job_connect_carries_a_large_stream_both_ways(world: dict[str, Any], tmp_path: Path) -> None:
    fleet: Fleet = world["fleet"]
    job = running(fleet, "n-1", endpoint("tensorboard", public=False))
    listener = socket.create_server(("127.0.0.1", 0))
    payload = secrets.token_bytes(16 * 2**20)

    def serve() -> None:  # reads a length-prefixed upload, answers its digest, then sends `payload`
        conn, _ = listener.accept()
        with conn:
            size = int.from_bytes(conn.recv(8, socket.MSG_WAITALL), "big")
            digest = hashlib.sha256()
            while size:
                data = conn.recv(min(size, 65536))
                digest.update(data)
                size -= len(data)
            conn.sendall(digest.digest() + payload)

    threading.Thread(target=serve, daemon=True).start()
    world["worker"].ports[job["id"]] = 1  # only --port's remote side is dialed
    remote = listener.getsockname()[1]
    local = free_port()
    proc = subprocess.Popen(
        [PROVISION, "job", "connect", "tensorboard", "--port", f"{local}:{remote}"],
        env={**os.environ, **fleet.cp.env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert f"127.0.0.1:{local}" in line, line
        upload = secrets.token_bytes(12 * 2**20)
        with socket.create_connection(("127.0.0.1", local), timeout=60) as c:
            c.sendall(len(upload).to_bytes(8, "big") + upload)
            got = b""
            while len(got) < 32 + len(payload):
                data = c.recv(1 << 20)
                assert data, f"closed after {len(got)} bytes"
                got += data
        assert got[:32] == hashlib.sha256(upload).digest()
        assert hashlib.sha256(got[32:]).digest() == hashlib.sha256(payload).digest()
    finally:
        stop(proc)  # type: ignore[arg-type]
        listener.close()


def test_a_notebooks_kernel_runs_a_cell_through_the_url(world: dict[str, Any], tmp_path: Path) -> None:
    fleet: Fleet = world["fleet"]
    job = running(
        fleet, "n-1", {"name": "nb", "type": "notebook", "resources": {"gpu_count": 0, "cpu_count": 4}}
    )
    shown = json.loads(fleet.cp.provision("job", "url", "nb", "--json").stdout)
    with jupyter(tmp_path, job["id"], shown["token"]) as port:
        world["worker"].ports[job["id"]] = port
        base = f"{fleet.cp.url}/j/{job['id']}/"
        assert (
            httpx.get(base + "api/kernels", verify=fleet.cp.verify).status_code == 401
        )  # no token, no session
        with fleet.http() as http:
            assert http.get(base + "lab").status_code == 200
            kernel = http.post(base + "api/kernels", json={"name": "python3"})
            assert kernel.status_code == 201, kernel.text
        assert run_cell(fleet, base, kernel.json()["id"], "6*7") == "42"
        with fleet.http(fleet.other_token) as http:
            assert http.get(base + "api/kernels").status_code == 404
        # the minion's reading of the notebook's idleness, from Jupyter itself (the autostop's input)
        serve = ServeBinding(
            port=port, health_path=f"/j/{job['id']}/api", status_path=f"/j/{job['id']}/api/status"
        )
        held = kernel_socket(fleet, base, kernel.json()["id"])
        try:
            assert notebook_idle_s("127.0.0.1", serve, shown["token"], datetime.now(UTC)) == 0.0
        finally:
            held.close()
        time.sleep(1.5)
        later = datetime.now(UTC) + timedelta(minutes=5)
        idle = notebook_idle_s("127.0.0.1", serve, shown["token"], later)
        assert idle is not None and 300 <= idle < 400, idle
        assert notebook_idle_s("127.0.0.1", serve, "wrong-token", later) is None


def test_a_jobs_url_token_and_connect_are_its_own_accounts_even_against_a_root_admin(
    world: dict[str, Any],
) -> None:
    fleet: Fleet = world["fleet"]
    with fleet.http() as http:  # the root account shares a project: another account's job runs in it
        assert http.post("/v1/projects", json={"name": "shared-urls"}).status_code == 201
        assert http.post("/v1/projects/shared-urls/shares", json={"account": "other"}).status_code == 201
    theirs_spec = {"name": "theirs-nb", "type": "notebook", "resources": {"gpu_count": 0, "cpu_count": 4}}
    with fleet.http(fleet.other_token) as http:
        made = http.post("/v1/jobs", json={"spec": theirs_spec, "project": "default/shared-urls"})
        assert made.status_code == 201, made.text
        theirs = made.json()
    fleet.heartbeat("n-1", [report(a, "running") for a in fleet.heartbeat("n-1")["workers"]])
    world["worker"].ports[theirs["id"]] = world["http_port"]
    served_at = world["site"] / "j" / theirs["id"]  # a notebook's server gets the whole path (its base_url)
    served_at.mkdir(parents=True)
    (served_at / "index.html").write_text("their notebook\n")
    url = f"{fleet.cp.url}/j/{theirs['id']}/index.html"
    with fleet.http(fleet.other_token) as http:  # its own account: the URL and the notebook's token
        answer = http.get(url)
        assert answer.status_code == 200 and answer.text == "their notebook\n", answer.text
        assert http.get(f"/v1/jobs/{theirs['id']}/url").json()["token"]
    with fleet.http() as http:  # a root admin sees the job, but gets neither in
        assert http.get(f"/v1/jobs/{theirs['id']}").status_code == 200
        assert http.get(url).status_code == 404
        shown = http.get(f"/v1/jobs/{theirs['id']}/url").json()
        assert shown["token"] is None and not shown["ready"], shown
    ws = websocket.create_connection(  # `job connect`: closed with the reason, which the CLI prints
        fleet.cp.url.replace("https://", "wss://") + f"/v1/jobs/{theirs['id']}/connect?port=8000",
        header=[f"Authorization: Bearer {fleet.cp.token}"],
        sslopt={"ca_certs": str(fleet.cp.ca)},
        timeout=15,
    )
    opcode, frame = ws.recv_data(control_frame=True)
    assert opcode == websocket.ABNF.OPCODE_CLOSE and int.from_bytes(frame[:2], "big") == 1008
    assert (
        frame[2:].decode() == "job 'theirs-nb' is another account's: only its own account may connect to it"
    )
    ws.close()
    with fleet.http() as http:
        assert http.post(f"/v1/jobs/{theirs['id']}/stop").status_code == 200


def test_an_idle_notebook_is_autostopped_and_a_used_one_keeps_running(world: dict[str, Any]) -> None:
    fleet: Fleet = world["fleet"]
    spec = {"type": "notebook", "resources": {"gpu_count": 0, "cpu_count": 4}, "autostop_minutes": 30}
    idle = running(fleet, "n-1", {"name": "idle-nb", **spec})
    used = running(fleet, "n-1", {"name": "used-nb", **spec})
    mine = {a["job_id"]: a for a in fleet.heartbeat("n-1")["workers"]}
    jobs = fleet.heartbeat(
        "n-1",
        [
            report(mine[idle["id"]], "running", idle_s=31 * 60),
            report(mine[used["id"]], "running", idle_s=0),
        ],
    )
    stopping = {a["job_id"]: a["stop"] for a in jobs["workers"]}
    assert stopping[idle["id"]] is True and stopping[used["id"]] is False
    with fleet.http() as http:
        stopped = http.get(f"/v1/jobs/{idle['id']}").json()
        assert stopped["state"] == "stopped", stopped
        assert stopped["reason"] == "autostopped: idle for 30 min (no kernel activity and no connection)"
        assert http.get(f"/v1/jobs/{used['id']}").json()["state"] == "running"
    assert (stopped["autostop_minutes"], idle["autostop_minutes"]) == (30, 30)
    with browser(fleet.cp) as client:  # the console says how long is left, and links the URL
        sign_in(client, fleet.cp.token)
        page = client.get(f"/jobs/{used['id']}")
        assert page.status_code == 200, page.text
        assert re.search(r'id="job-autostop">idle: stops in (29m|30m)', page.text), page.text
        assert f'href="/j/{used["id"]}/lab"' in page.text
        # a console session is a notebook's sign-in: the proxy answers it (the worker is not reachable
        # here, so the tunnel's refusal shows it got that far)
        assert client.get(f"/j/{used['id']}/api").status_code == 502


def kernel_socket(fleet: Fleet, base: str, kernel_id: str) -> websocket.WebSocket:
    return websocket.create_connection(
        base.replace("https://", "wss://") + f"api/kernels/{kernel_id}/channels",
        header=[f"Authorization: Bearer {fleet.cp.token}"],
        sslopt={"ca_certs": str(fleet.cp.ca)},
        timeout=60,
    )


def run_cell(fleet: Fleet, base: str, kernel_id: str, code: str) -> str:
    ws = kernel_socket(fleet, base, kernel_id)
    try:
        msg_id = uuid.uuid4().hex
        ws.send(
            json.dumps(
                {
                    "header": {
                        "msg_id": msg_id,
                        "session": uuid.uuid4().hex,
                        "username": "test",
                        "msg_type": "execute_request",
                        "version": "5.3",
                    },
                    "parent_header": {},
                    "metadata": {},
                    "channel": "shell",
                    "content": {"code": code, "silent": False},
                }
            )
        )
        while True:
            message = json.loads(ws.recv())
            if message.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if message["msg_type"] == "execute_result":
                return str(message["content"]["data"]["text/plain"])
    finally:
        ws.close()


@contextmanager
def jupyter(tmp_path: Path, job_id: str, token: str) -> Iterator[int]:
    assert JUPYTER is not None, "jupyterlab is a test dependency: run `make deps`"
    port = free_port()
    d = tmp_path / "jupyter"
    for sub in ("config", "data", "runtime", "ipython", "home", "nb"):
        (d / sub).mkdir(parents=True)
    env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(d / "config"),
        "JUPYTER_DATA_DIR": str(d / "data"),
        "JUPYTER_RUNTIME_DIR": str(d / "runtime"),
        "IPYTHONDIR": str(d / "ipython"),
        "HOME": str(d / "home"),
        "JUPYTER_TOKEN": token,
    }
    proc = subprocess.Popen(
        [
            JUPYTER,
            "lab",
            "--ip=127.0.0.1",
            f"--port={port}",
            "--no-browser",
            "--allow-root",
            "--ServerApp.port_retries=0",
            f"--ServerApp.base_url=/j/{job_id}/",
            f"--ServerApp.root_dir={d / 'nb'}",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=(d / "log").open("w"),
    )
    try:
        until_ready(
            proc,  # type: ignore[arg-type]
            lambda: httpx.get(f"http://127.0.0.1:{port}/j/{job_id}/api").status_code == 200,
            "jupyter lab",
            d / "log",
            60,
        )
        yield port
    finally:
        stop(proc)  # type: ignore[arg-type]


def test_the_url_works_again_after_the_control_plane_restarts(tmp_path: Path) -> None:
    """The minion's tunnel reconnects by itself; a client's kept-alive connection is cut by the restart
    and its next request (a new connection) succeeds through the new process."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("still here\n")
    port = free_port()
    with file_server(site) as http_port:
        with fleet_at(tmp_path / "home", port) as fleet:
            one_node(fleet)
            job = running(fleet, "n-1", endpoint("survivor", public=True))
            worker = Worker({job["id"]: http_port})
            tunnel = tunnel_of(fleet, "n-1", worker)
            client = httpx.Client(verify=fleet.cp.verify, timeout=30)
            url = f"{fleet.cp.url}/j/{job['id']}/"
            assert client.get(url).text == "still here\n"
        try:
            deadline = time.monotonic() + 5
            while tunnel.connected.is_set() and time.monotonic() < deadline:  # it noticed the server go
                time.sleep(0.05)
            with fleet_at(tmp_path / "home", port) as again:
                assert tunnel.connected.wait(60), "the tunnel did not reconnect"
                answer = client.get(url)
                assert answer.status_code == 200 and answer.text == "still here\n", answer.text
                assert again.cp.url == fleet.cp.url
        finally:
            client.close()
            tunnel.close()


def test_a_projects_notebook_autostop_stops_its_notebooks_that_name_none(world: dict[str, Any]) -> None:
    fleet: Fleet = world["fleet"]
    with fleet.http() as http:
        made = http.post("/v1/projects", json={"name": "short-nb", "notebook_autostop_minutes": 10})
        assert made.status_code == 201, made.text
    spec = {"type": "notebook", "resources": {"gpu_count": 0, "cpu_count": 4}}
    short = running(fleet, "n-1", {"name": "short-nb", **spec}, project="short-nb")
    own = running(fleet, "n-1", {"name": "own-nb", **spec, "autostop_minutes": 20}, project="short-nb")
    usual = running(fleet, "n-1", {"name": "usual-nb", **spec})  # the default project: the built-in hour
    assert [j["autostop_minutes"] for j in (short, own, usual)] == [10, 20, 60]
    mine = {a["job_id"]: a for a in fleet.heartbeat("n-1")["workers"]}
    eleven = [report(mine[j["id"]], "running", idle_s=11 * 60) for j in (short, own, usual)]
    stopping = {a["job_id"]: a["stop"] for a in fleet.heartbeat("n-1", eleven)["workers"]}
    assert [stopping[j["id"]] for j in (short, own, usual)] == [True, False, False]
    with fleet.http() as http:
        stopped = http.get(f"/v1/jobs/{short['id']}").json()
        assert stopped["reason"] == "autostopped: idle for 10 min (no kernel activity and no connection)"
        # a new project default reaches running notebooks that name none, at their next report
        changed = http.patch("/v1/projects/default", json={"notebook_autostop_minutes": 0})
        assert changed.status_code == 200, changed.text
        assert http.get(f"/v1/jobs/{usual['id']}").json()["autostop_minutes"] == 0
        late = [report(mine[usual["id"]], "running", idle_s=5 * 3600)]
        assert fleet.heartbeat("n-1", late)["workers"]
        assert http.get(f"/v1/jobs/{usual['id']}").json()["state"] == "running"
        http.patch("/v1/projects/default", json={"notebook_autostop_minutes": None})
        for job in (own, usual):
            http.post(f"/v1/jobs/{job['id']}/stop")
