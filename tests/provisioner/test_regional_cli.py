"""The real `provision reservation|datastore …` CLI (subprocess) against a real server (`api_server`):
the operator walkthrough, desired vs actual in `show --json`, exit codes, one-line errors, no partial
state, and the SMB password never coming back out."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from provisioner.domain.states import NodeState
from provisioner.services import beat
from provisioner.services.fleet import nodes
from provisioner.store.engine import make_engine, make_sessionmaker
from tests.fixtures.control_plane import ControlPlane
from tests.fixtures.postgres import Store
from tests.provisioner.test_cli_e2e import _ok, _refused

MID = ["%032x" % (0xB0 + i) for i in range(4)]
PASSWORD = "correct-horse-battery-staple"


@pytest.fixture
def fleet(api_server: ControlPlane) -> Iterator[tuple[ControlPlane, Store]]:
    """A central region with a storage node (active, as its finalize would leave it) and two compute
    nodes, a second region, and the server's own store."""
    engine = make_engine(api_server.database_url)
    sessions = make_sessionmaker(engine)
    with api_server.client() as http:  # setup through the API: the node/region CLI has its own tests
        requests = [
            ("/v1/providers", {"kind": "physical"}),
            ("/v1/regions", {"name": "lab-1", "provider": "physical", "storage_mode": "central"}),
            ("/v1/regions", {"name": "lab-2", "provider": "physical"}),
            ("/v1/nodes", {"name": "nas-1", "region": "lab-1", "minion_id": MID[2], "service": "storage"}),
            ("/v1/nodes", {"name": "gpu-9", "region": "lab-2", "minion_id": MID[3]}),
        ]
        for path, body in requests:
            assert http.post(path, json=body).status_code == 201, (path, body)
        with sessions.begin() as s:
            nas = nodes.get(s, "nas-1")
            for state in (NodeState.ENROLLING, NodeState.PROVISIONING, NodeState.ACTIVE):
                nodes.transition(s, nas, state, actor="minion:test")
        for name, mid in (("gpu-1", MID[0]), ("gpu-2", MID[1])):
            body = {"name": name, "region": "lab-1", "minion_id": mid}
            assert http.post("/v1/nodes", json=body).status_code == 201, body
    yield api_server, Store(api_server.database_url, engine, sessions)
    engine.dispose()


def test_reservation_walkthrough_desired_and_actual(fleet: tuple[ControlPlane, Store]) -> None:
    cp, store = fleet
    rid = _ok(
        cp, "reservation", "add", "nb", "--region", "lab-1", "--hostname", "jupyter", "--port", "8888"
    ).strip()
    assert rid.startswith("rsv_")
    _ok(
        cp,
        "reservation",
        "add",
        "dns",
        "--region",
        "lab-1",
        "--hostname",
        "resolver",
        "--port",
        "5353",
        "--protocol",
        "udp",
        "--expose-wan",
    )
    table = _ok(cp, "reservation", "list", "--region", "lab-1")
    assert rid in table and "jupyter.local" in table and "unassigned" in table
    wide = _ok(cp, "reservation", "list", "--region", "lab-1", "-o", "wide")
    assert "lan-only" in wide and "exposed" in wide  # nb LAN-only by default, dns opted in
    assert json.loads(_ok(cp, "reservation", "show", "dns", "--json"))["expose_wan"] is True
    assert "gpu-1" in _ok(cp, "reservation", "assign", "nb", "--node", "gpu-1")
    shown = json.loads(_ok(cp, "reservation", "show", "nb", "--json"))
    assert shown["state"] == "pending" and shown["desired"] == {
        "state": "assigned",
        "node": "gpu-1",
        "node_id": shown["desired"]["node_id"],
        "job": None,
        "job_id": None,
        "expose_wan": False,
    }
    assert (shown["expose_wan"], shown["job"]) == (False, None)
    assert shown["actual"]["state"] == "pending"

    # the heartbeat path (the route calls exactly these two functions): desired out, actual back in
    with store.sessions.begin() as s:  # type: ignore[attr-defined]
        node = nodes.get(s, "gpu-1")
        desired = beat.desired_for(s, node)
        assert desired["reservations"] == [
            {"name": "nb", "hostname": "jupyter", "port": 8888, "protocol": "tcp", "expose_wan": False}
        ]
    assert "expose_wan  yes" in _ok(cp, "reservation", "update", "nb", "--expose-wan")  # opt-in: the router
    with store.sessions.begin() as s:  # type: ignore[attr-defined]
        node = nodes.get(s, "gpu-1")
        assert beat.desired_for(s, node)["reservations"][0]["expose_wan"] is True
        beat.record_actual(
            s,
            node,
            {
                "reservations": [
                    {
                        "name": "nb",
                        "state": "mapped",
                        "mdns": "published",
                        "upnp": "mapped",
                        "address": "10.77.0.10",
                        "external_address": "198.51.100.4:8888",
                        "reason": None,
                    }
                ]
            },
        )
    shown = json.loads(_ok(cp, "reservation", "show", "nb", "--json"))
    assert (shown["state"], shown["desired"]["state"], shown["desired"]["node"]) == (
        "mapped",
        "assigned",
        "gpu-1",
    )
    assert shown["actual"]["state"] == "mapped" and shown["actual"]["address"] == "10.77.0.10"
    assert shown["actual"]["external_address"] == "198.51.100.4:8888" and shown["actual"]["reported_at"]
    assert "198.51.100.4:8888" in _ok(cp, "reservation", "list")
    human = {
        line.split(None, 1)[0]: line.split(None, 1)[1].strip() if " " in line.strip() else ""
        for line in _ok(cp, "reservation", "show", "nb").splitlines()
    }
    # desired and actual, a line per field (not a JSON line), times local to the second
    assert human["desired.node"] == "gpu-1" and human["actual.state"] == "mapped"
    assert human["actual.external_address"] == "198.51.100.4:8888" and "{" not in "".join(human.values())
    assert len(human["actual.reported_at"]) == len("YYYY-MM-DD HH:MM:SS")

    _ok(cp, "reservation", "assign", "nb", "--node", "gpu-2")  # move
    assert json.loads(_ok(cp, "reservation", "show", "nb", "--json"))["actual"]["state"] == "pending"
    assert json.loads(_ok(cp, "reservation", "unassign", "nb", "--json"))["state"] == "unassigned"
    history = json.loads(_ok(cp, "reservation", "history", "nb", "--json"))
    assert [(h["from_state"], h["to_state"]) for h in history] == [
        (None, "unassigned"),
        ("unassigned", "assigned"),
        ("assigned", "assigned"),  # now exposed on the WAN
        ("pending", "mapped"),
        ("assigned", "assigned"),
        ("assigned", "unassigned"),
    ]
    assert {h["actor"] for h in history} == {"operator:admin", f"minion:{MID[0]}"}
    _refused(cp, "reservation", "remove", "nb", exit_code=2)  # no terminal, no --yes
    _ok(cp, "reservation", "remove", "nb", "--yes")
    assert [r["name"] for r in json.loads(_ok(cp, "reservation", "list", "--json"))] == ["dns"]


def test_datastore_walkthrough_password_never_returned(
    fleet: tuple[ControlPlane, Store], tmp_path: Path
) -> None:
    cp, _ = fleet
    secret = tmp_path / "pw"
    secret.write_text(PASSWORD + "\n")
    secret.chmod(0o600)
    secret.chmod(0o600)
    did = _ok(
        cp,
        "datastore",
        "add",
        "office",
        "--region",
        "lab-1",
        "--type",
        "smb",
        "--address",
        "nas.lan",
        "--root",
        "/share/projects",
        "--username",
        "rig",
        "--password-file",
        str(secret),
    ).strip()
    assert did.startswith("ds_")
    _ok(
        cp,
        "datastore",
        "add",
        "scratch",
        "--region",
        "lab-1",
        "--type",
        "nfs",
        "--address",
        "10.0.0.5",
        "--root",
        "/srv/scratch",
    )
    with cp.client() as client:
        outputs = [
            _ok(cp, "datastore", "show", "office", "--json"),
            _ok(cp, "datastore", "show", "office"),
            _ok(cp, "datastore", "list"),
            _ok(cp, "datastore", "list", "--json"),
            client.get("/v1/datastores/office").text,
            client.get("/openapi.json").text,
        ]
    assert all(PASSWORD not in out for out in outputs)
    shown = json.loads(outputs[0])
    assert (shown["type"], shown["root"], shown["username"], shown["has_password"]) == (
        "smb",
        "/share/projects",
        "rig",
        True,
    )
    assert "password" not in shown
    db = Path(cp.database_url.removeprefix("sqlite:///"))
    assert PASSWORD.encode() not in b"".join(p.read_bytes() for p in db.parent.glob(db.name + "*"))
    _ok(cp, "datastore", "remove", "scratch", "--yes")
    assert [d["name"] for d in json.loads(_ok(cp, "datastore", "list", "--json"))] == ["office"]


def test_bad_input_is_one_line_and_changes_nothing(fleet: tuple[ControlPlane, Store], tmp_path: Path) -> None:
    cp, store = fleet
    _ok(cp, "reservation", "add", "nb", "--region", "lab-1", "--hostname", "jupyter", "--port", "8888")
    pw = tmp_path / "pw"
    pw.write_text("x")
    pw.chmod(0o600)
    loose = tmp_path / "loose-pw"
    loose.write_text("x")  # 0644: others may read it
    cases = [
        (
            2,
            ["reservation", "add", "web", "--region", "lab-1", "--hostname", "web", "--port", "0"],
            "port 0 is out of range",
        ),
        (
            2,
            ["reservation", "add", "web", "--region", "lab-1", "--hostname", "Web_1", "--port", "9000"],
            "not a DNS label",
        ),
        (
            2,
            [
                "reservation",
                "add",
                "web",
                "--region",
                "lab-1",
                "--hostname",
                "web",
                "--port",
                "9000",
                "--protocol",
                "sctp",
            ],
            "sctp",
        ),
        (
            1,
            ["reservation", "add", "web", "--region", "lab-1", "--hostname", "jupyter", "--port", "9000"],
            "hostname jupyter is already used",
        ),
        (
            1,
            ["reservation", "add", "web", "--region", "lab-1", "--hostname", "web", "--port", "8888"],
            "port 8888 is already used",
        ),
        (1, ["reservation", "assign", "nb", "--node", "nas-1"], "is a storage node"),
        (1, ["reservation", "assign", "nb", "--node", "gpu-9"], "is in region 'lab-2'"),
        (1, ["reservation", "unassign", "nb"], "is unassigned and cannot go to unassigned"),
        (1, ["reservation", "show", "ghost"], "reservation 'ghost' does not exist"),
        (
            2,
            [
                "datastore",
                "add",
                "d",
                "--region",
                "lab-1",
                "--type",
                "nfs",
                "--address",
                "h",
                "--root",
                "/a/../b",
            ],
            "'..'",
        ),
        (
            2,
            [
                "datastore",
                "add",
                "d",
                "--region",
                "lab-1",
                "--type",
                "nfs",
                "--address",
                "h",
                "--root",
                "/a",
                "--username",
                "u",
                "--password-file",
                str(pw),
            ],
            "NFS takes no credentials",
        ),
        (
            2,
            ["datastore", "add", "d", "--region", "lab-1", "--type", "smb", "--address", "h", "--root", "/a"],
            "SMB needs",
        ),
        (
            2,
            [
                "datastore",
                "add",
                "d",
                "--region",
                "lab-1",
                "--type",
                "smb",
                "--address",
                "h",
                "--root",
                "/a",
                "--username",
                "u",
                "--password-file",
                str(tmp_path / "missing"),
            ],
            "cannot read password file",
        ),
        (
            2,
            [
                "datastore",
                "add",
                "d",
                "--region",
                "lab-1",
                "--type",
                "smb",
                "--address",
                "h",
                "--root",
                "/a",
                "--username",
                "u",
                "--password-file",
                str(loose),
            ],
            f"is readable by others: run `chmod 600 {loose}` first",
        ),
        (
            2,
            [
                "datastore",
                "add",
                "d",
                "--region",
                "lab-1",
                "--type",
                "ceph",
                "--address",
                "h",
                "--root",
                "/a",
            ],
            "ceph",
        ),
    ]
    before = store.snapshot()
    for exit_code, args, fragment in cases:
        r = cp.provision(*args)
        assert r.returncode == exit_code, (args, r.returncode, r.stderr)
        lines = r.stderr.strip().splitlines()
        # ours: exactly one line; click's own usage errors (an unknown --protocol choice) end in one
        assert len(lines) == 1 or lines[0].startswith("Usage:"), (args, r.stderr)
        assert fragment in lines[-1] and lines[-1].lower().startswith("error:"), (args, r.stderr)
    assert store.snapshot() == before
