"""The real `provision` CLI (subprocess) against a real server: the operator's walkthrough, --json,
exit codes and one-line errors; `provision serve` refusing bad databases."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import select, text

from provisioner.store.engine import make_engine
from provisioner.store.migrate import upgrade
from provisioner.store.models import Node
from tests.fixtures.control_plane import PROVISION, ControlPlane
from tests.fixtures.postgres import free_port

MID = ["%032x" % (0xA0 + i) for i in range(6)]


def _ok(cp: ControlPlane, *args: str) -> str:
    r = cp.provision(*args)
    assert r.returncode == 0, (args, r.stderr)
    return r.stdout


def _refused(cp: ControlPlane, *args: str, exit_code: int = 1) -> str:
    r = cp.provision(*args)
    assert r.returncode == exit_code, (args, r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    return lines[0]


def test_walkthrough_with_tables_and_json(api_server: ControlPlane) -> None:
    config = api_server.home / "client.json"
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    # the client config alone is enough (no RIGBASE_URL / RIGBASE_TOKEN)
    env = {k: v for k, v in os.environ.items() if k not in ("RIGBASE_URL", "RIGBASE_TOKEN")}
    r = subprocess.run(
        [str(PROVISION), "provider", "enable", "physical"],
        capture_output=True,
        text=True,
        env={**env, "RIGBASE_HOME": str(api_server.home)},
    )
    assert r.returncode == 0 and r.stdout.strip().startswith("prv_"), r.stderr

    region_id = _ok(
        api_server, "region", "create", "lab-1", "--provider", "physical", "--no-public-jobs"
    ).strip()
    assert region_id.startswith("reg_")
    node_id = _ok(
        api_server, "node", "add", "gpu-1", "--region", "lab-1", "--minion-id", MID[0], "--no-upnp"
    ).strip()
    # storage nodes serve central regions only: refused in lab-1 (local), added in hub-1
    storage_add = ("node", "add", "nas", "--minion-id", MID[1], "--service", "storage", "--json")
    assert "only regions in central storage mode" in _refused(api_server, *storage_add, "--region", "lab-1")
    _ok(api_server, "region", "create", "hub-1", "--provider", "physical", "--storage-mode", "central")
    storage = json.loads(_ok(api_server, *storage_add, "--region", "hub-1"))
    assert storage["service"] == "storage" and storage["state"] == "new"

    table = _ok(api_server, "node", "list")
    assert node_id in table and "…" not in table  # ids never truncated
    assert MID[0] in _ok(api_server, "node", "list", "-o", "wide")  # the minion id is a wide column
    nodes = json.loads(_ok(api_server, "node", "list", "--json"))
    assert {n["name"]: (n["state"], n["online"], n["upnp"]) for n in nodes} == {
        "gpu-1": ("new", False, False),
        "nas": ("new", False, True),
    }
    regions = json.loads(_ok(api_server, "region", "list", "--json"))
    assert [(r["name"], r["public_jobs"], r["storage_mode"], r["state"]) for r in regions] == [
        ("hub-1", True, "central", "new"),
        ("lab-1", False, "local", "new"),
    ]
    assert json.loads(_ok(api_server, "provider", "show", "physical", "--json"))["payment_mode"] == "credits"

    line = _refused(api_server, "node", "maintenance", "gpu-1", "off")
    assert "is new: it waits for its minion" in line and "node pending" in line
    history = json.loads(_ok(api_server, "node", "history", "gpu-1", "--json"))
    assert [(e["from_state"], e["to_state"], e["actor"]) for e in history] == [
        (None, "new", "operator:admin")
    ]

    new_id = _ok(api_server, "node", "replace", "nas", "--minion-id", MID[2], "--yes").strip()
    assert new_id.startswith("node_") and new_id != storage["id"]
    # remove asks first; without a terminal and without --yes it refuses (usage error) and changes nothing
    _refused(api_server, "node", "remove", "gpu-1", exit_code=2)
    assert json.loads(_ok(api_server, "node", "show", "gpu-1", "--json"))["state"] == "new"
    _refused(api_server, "region", "remove", "lab-1", "--yes")
    # refused before it asks (no --yes, no terminal: it would otherwise stop at the question, exit 2)
    in_use = _refused(api_server, "region", "remove", "lab-1")
    assert "still has" in in_use and "--force" in in_use
    gpu_id = json.loads(_ok(api_server, "node", "show", "gpu-1", "--json"))["id"]
    assert _ok(api_server, "node", "remove", "gpu-1", "--yes").splitlines() == [
        f"node 'gpu-1' removed ({gpu_id})"
    ]
    gone = _refused(api_server, "node", "show", "gpu-1")
    assert f"node 'gpu-1' was removed ({gpu_id})" in gone and f"provision node history {gpu_id}" in gone
    removed = json.loads(_ok(api_server, "region", "remove", "lab-1", "--force", "--yes", "--json"))
    assert removed["state"] == "removed"
    _ok(api_server, "region", "remove", "hub-1", "--force", "--yes")
    assert json.loads(_ok(api_server, "node", "list", "--json")) == []


def test_bad_input_exit_codes_and_no_change(api_server: ControlPlane) -> None:
    _ok(api_server, "provider", "enable", "physical")
    _ok(api_server, "region", "create", "central-1", "--provider", "physical", "--storage-mode", "central")
    before = (
        _ok(api_server, "node", "list", "--removed", "--json"),
        _ok(api_server, "region", "list", "--json"),
    )
    assert "not a DNS label" in _refused(
        api_server, "region", "create", "Bad_Name", "--provider", "physical", exit_code=2
    )
    assert "unknown provider" in _refused(
        api_server, "region", "create", "x", "--provider", "aws", exit_code=2
    )
    assert "32 lowercase hex" in _refused(
        api_server, "node", "add", "g", "--region", "central-1", "--minion-id", "XYZ", exit_code=2
    )
    assert "does not exist" in _refused(
        api_server, "node", "add", "g", "--region", "nowhere", "--minion-id", MID[3]
    )
    assert "central storage" in _refused(
        api_server, "node", "add", "g", "--region", "central-1", "--minion-id", MID[3]
    )
    _ok(
        api_server,
        "node",
        "add",
        "nas",
        "--region",
        "central-1",
        "--minion-id",
        MID[4],
        "--service",
        "storage",
    )
    assert "already has storage node 'nas'" in _refused(
        api_server,
        "node",
        "add",
        "nas2",
        "--region",
        "central-1",
        "--minion-id",
        MID[5],
        "--service",
        "storage",
    )
    assert "held by node 'nas'" in _refused(
        api_server, "node", "add", "g", "--region", "central-1", "--minion-id", MID[4]
    )
    after = json.loads(_ok(api_server, "node", "list", "--removed", "--json"))
    assert [n["name"] for n in after] == ["nas"] and json.loads(before[0]) == []
    # a usage error is click's (exit 2); a wrong token is a refusal (exit 1)
    assert api_server.provision("node", "add", "g").returncode == 2
    r = subprocess.run(
        [str(PROVISION), "node", "list"],
        capture_output=True,
        text=True,
        env={**api_server.env, "RIGBASE_TOKEN": "rbo_wrong"},
    )
    assert r.returncode == 1 and r.stderr.strip() == (
        "error: the bearer token is not valid: "
        "use the token in the client config written by `provision serve`"
    )
    r = subprocess.run(
        [str(PROVISION), "node", "list"],
        capture_output=True,
        text=True,
        env={**api_server.env, "RIGBASE_URL": f"http://127.0.0.1:{free_port()}"},
    )
    assert (
        r.returncode == 1 and "cannot reach the control plane" in r.stderr and len(r.stderr.splitlines()) == 1
    )


def _serve(home: Path, database: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(PROVISION), "serve", "--port", str(free_port()), "--database", database],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "RIGBASE_HOME": str(home)},
    )


def test_serve_refuses_unreachable_and_newer_databases(tmp_path: Path) -> None:
    r = _serve(tmp_path, f"postgresql://postgres@127.0.0.1:{free_port()}/rigbase")
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [r.stderr.strip()]
    assert "cannot reach the database" in r.stderr
    assert not (tmp_path / "client.json").exists()

    url = f"sqlite:///{tmp_path / 'newer.db'}"
    engine = make_engine(url)
    upgrade(url, engine)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999_future'"))
    engine.dispose()
    r = _serve(tmp_path, url)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert "newer than this rigbase" in r.stderr
    assert not (tmp_path / "client.json").exists()


def test_node_add_wait_follows_the_node_until_it_is_ready(api_server: ControlPlane) -> None:
    """--wait polls until the joined node reaches maintenance; the join side is driven through the
    same service function the join routes use, on the server's own store."""
    from provisioner.domain.states import NodeState
    from provisioner.services.fleet import nodes
    from provisioner.store.engine import make_sessionmaker

    _ok(api_server, "provider", "enable", "physical")
    _ok(api_server, "region", "create", "lab-1", "--provider", "physical")
    proc = subprocess.Popen(
        [
            str(PROVISION),
            "node",
            "add",
            "gpu-1",
            "--region",
            "lab-1",
            "--minion-id",
            MID[0],
            "--wait",
            "--timeout",
            "60",
            "--json",
        ],
        env=api_server.env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    engine = make_engine(api_server.database_url)
    node_id = None
    for _ in range(200):
        with make_sessionmaker(engine).begin() as s:
            node = s.scalar(select(Node).where(Node.name == "gpu-1"))
            if node is not None:
                node_id = node.id
                for state in (NodeState.ENROLLING, NodeState.PROVISIONING, NodeState.MAINTENANCE):
                    nodes.transition(s, node, state, actor="minion:test")
                break
        time.sleep(0.05)
    engine.dispose()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    shown = json.loads(out)
    assert shown["id"] == node_id and shown["state"] == "maintenance"

    r = api_server.provision(
        "node", "add", "gpu-2", "--region", "lab-1", "--minion-id", MID[1], "--wait", "--timeout", "1"
    )
    assert r.returncode == 1 and "is still new after 1 s" in r.stderr


def test_admin_token_is_stored_hashed_and_kept_across_restarts(tmp_path: Path) -> None:
    from tests.fixtures.control_plane import start_control_plane

    home = tmp_path / "home"
    with start_control_plane(home) as first:
        _ok(first, "provider", "enable", "physical")
    with start_control_plane(home) as second:  # another free port
        config = json.loads((home / "client.json").read_text())
        assert config == {"url": second.url, "token": first.token, "ca": str(second.ca)}
        assert first.url != second.url and second.url.startswith("https://127.0.0.1:")
        assert json.loads(_ok(second, "provider", "list", "--json"))[0]["kind"] == "physical"
    engine = make_engine(f"sqlite:///{home / 'rigbase.db'}")
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT name, role, token_sha256 FROM api_tokens")).all()
    engine.dispose()
    assert stored == [("admin", "admin", hashlib.sha256(first.token.encode()).hexdigest())]
    assert first.token.encode() not in b"".join(p.read_bytes() for p in home.glob("rigbase.db*"))


def test_serve_on_a_busy_port_changes_nothing_and_says_what_holds_it(tmp_path: Path) -> None:
    """Operator paper cut: serve printed "control plane on …", then uvicorn's error, and the home's
    client.json had been pointed at whatever held the port."""
    port = free_port()
    squatter = subprocess.Popen(
        [sys.executable, "-c", f"import socket, time; s = socket.create_server(('127.0.0.1', {port})); "
         "print('up', flush=True); time.sleep(120)"],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert squatter.stdout is not None and squatter.stdout.readline().strip() == "up"
        home = tmp_path / "home"
        home.mkdir()
        before = '{"url": "https://127.0.0.1:8443", "token": "rb_keep"}\n'
        (home / "client.json").write_text(before)
        r = subprocess.run(
            [str(PROVISION), "serve", "--insecure-http", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "RIGBASE_HOME": str(home)},
        )
        assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert f"cannot listen on 127.0.0.1:{port} (held by pid {squatter.pid} (" in r.stderr
        assert "--port" in r.stderr and "control plane on" not in r.stderr
        assert sorted(p.name for p in home.iterdir()) == ["client.json"]  # no store, no CA, no token
        assert (home / "client.json").read_text() == before
    finally:
        squatter.kill()
        squatter.wait()


def test_the_url_and_the_ca_are_independent_and_a_lost_home_is_named(
    api_server: ControlPlane, tmp_path: Path
) -> None:
    """Operator paper cuts: RIGBASE_URL (the same server by another name) dropped the home's CA, so the
    right server was called a possible impostor; and a shell without RIGBASE_HOME was invited to start a
    second control plane."""
    bare = {k: v for k, v in os.environ.items() if not k.startswith("RIGBASE_")}
    by_name = api_server.url.replace("127.0.0.1", "localhost")
    env = {
        **bare,
        "RIGBASE_HOME": str(api_server.home),
        "RIGBASE_URL": by_name,
        "RIGBASE_TOKEN": api_server.token,
    }
    listed = subprocess.run(
        [str(PROVISION), "node", "list"], capture_output=True, text=True, env=env, timeout=60
    )
    assert listed.returncode == 0, listed.stderr

    lost = subprocess.run(
        [str(PROVISION), "node", "list"],
        capture_output=True,
        text=True,
        env={**bare, "RIGBASE_HOME": str(tmp_path / "elsewhere")},
        timeout=60,
    )
    assert lost.returncode == 1 and len(lost.stderr.strip().splitlines()) == 1, lost.stderr
    assert f"RIGBASE_HOME={api_server.home} (pid {api_server.process.pid})" in lost.stderr
    assert "provision serve`" not in lost.stderr  # no second control plane suggested


def test_node_history_folds_a_plays_tasks_unless_asked_and_never_cuts_a_reason(
    api_server: ControlPlane,
) -> None:
    from contracts.finalize import TaskStatus
    from provisioner.domain.task_lines import task_line
    from provisioner.services.common import audit
    from provisioner.store.engine import make_sessionmaker
    from tests.provisioner.test_join_http import api

    cp = api_server
    api(cp, "POST", "/v1/providers", {"kind": "physical", "config": {}})
    api(cp, "POST", "/v1/regions", {"name": "dc1", "provider": "physical"})
    node = api(cp, "POST", "/v1/nodes", {"name": "gpu-9", "region": "dc1", "minion_id": MID[5]})
    long_why = "the operator's reason, " + "which goes on and on " * 8 + "and ends here"
    engine = make_engine(cp.database_url)
    lines = [
        task_line("install the driver", TaskStatus.OK, None),
        task_line("mount /scratch", TaskStatus.CHANGED, "mounted: /dev/md0"),
        task_line("export it", TaskStatus.OK, None),
        long_why,
        task_line("it's quoted", TaskStatus.FAILED, "exit 1"),
    ]
    with make_sessionmaker(engine).begin() as s:
        for reason in lines:
            where = {"kind": "node", "resource_id": node["id"], "name": "gpu-9", "state": "new"}
            audit.note(s, **where, actor="minion:x", reason=reason)
    engine.dispose()

    folded = _ok(cp, "node", "history", "gpu-9")
    assert "NODE ID" not in folded and node["id"] not in folded
    assert "3 playbook task(s): 2 ok, 1 changed (--tasks lists them)" in folded
    assert "1 playbook task(s): 1 failed" in folded and "and ends here" in folded  # whole, not cut
    every = _ok(cp, "node", "history", "gpu-9", "--tasks")
    assert "task 'mount /scratch': changed: mounted: /dev/md0" in every and "playbook task(s)" not in every
    rows = json.loads(_ok(cp, "node", "history", "gpu-9", "--json"))
    assert [r["reason"] for r in rows][1:] == lines  # JSON is the history as it is (after the creation)
