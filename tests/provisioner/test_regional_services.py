"""Reservations and datastores in the store, on SQLite AND PostgreSQL: rules, states, audit, the
desired-state seam (contributor + reporter), and bad input leaving no partial state."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from minion.reservations.model import ActualState as NodeActualState
from provisioner.errors import Conflict, InvalidInput, NotFound, RigbaseError, RuleViolation
from provisioner.regional_states import ActualState
from provisioner.secrets import unseal
from provisioner.services import audit, datastores, desired_state, nodes, providers, regions, reservations
from tests.fixtures.postgres import Store

ACTOR = "operator:test"
MID = [f"{i:032x}" for i in range(1, 20)]


@pytest.fixture
def seeded(store: Store, tmp_path, monkeypatch: pytest.MonkeyPatch) -> Store:  # noqa: ANN001
    monkeypatch.setenv("RIGBASE_HOME", str(tmp_path / "home"))  # the secrets key lives here
    with store.sessions.begin() as s:  # type: ignore[attr-defined]
        providers.enable(s, "physical", {}, actor=ACTOR)
        regions.create(s, "lab-1", provider="physical", actor=ACTOR)
        regions.create(s, "lab-2", provider="physical", actor=ACTOR)
        nodes.add(s, "gpu-1", region="lab-1", minion_id=MID[0], actor=ACTOR)
        nodes.add(s, "gpu-2", region="lab-1", minion_id=MID[1], actor=ACTOR, upnp=False)
        nodes.add(s, "nas-1", region="lab-1", minion_id=MID[2], service="storage", actor=ACTOR)
        nodes.add(s, "gpu-9", region="lab-2", minion_id=MID[3], actor=ACTOR)
        reservations.add(s, "nb", region="lab-1", hostname="jupyter", port=8888, actor=ACTOR)
        datastores.add(s, "share", region="lab-1", type="nfs", address="10.0.0.5", root="/srv/data", actor=ACTOR)
    return store


def test_actual_states_cover_every_state_the_node_reports() -> None:
    assert {s.value for s in NodeActualState} <= {s.value for s in ActualState}


def test_assign_reaches_desired_state_and_the_report_is_kept_apart(seeded: Store) -> None:
    with seeded.sessions.begin() as s:  # type: ignore[attr-defined]
        rsv = reservations.assign(s, "nb", node="gpu-1", actor=ACTOR)
        assert (rsv.state, rsv.actual_state) == ("assigned", "pending")
        gpu1, gpu2 = nodes.get(s, "gpu-1"), nodes.get(s, "gpu-2")
        desired = desired_state.desired_for(s, gpu1)
        assert desired["reservations"] == [{"name": "nb", "hostname": "jupyter", "port": 8888, "protocol": "tcp"}]
        assert desired["upnp"] is True and desired_state.desired_for(s, gpu2)["upnp"] is False
        assert desired_state.desired_for(s, gpu2)["reservations"] == []
        desired_state.record_actual(s, gpu1, {"reservations": [
            {"name": "nb", "state": "mapped", "mdns": "published", "upnp": "mapped", "address": "10.0.0.7",
             "external_address": "198.51.100.4:8888", "reason": None}], "from-a-newer-minion": 1})
    with seeded.sessions.begin() as s:  # type: ignore[attr-defined]
        rsv = reservations.get(s, "nb")
        assert (rsv.state, rsv.actual_state, rsv.address, rsv.external_address) == (
            "assigned", "mapped", "10.0.0.7", "198.51.100.4:8888")
        # move: the old node's late report must not overwrite the new assignment
        reservations.assign(s, "nb", node="gpu-2", actor=ACTOR)
        desired_state.record_actual(s, nodes.get(s, "gpu-1"), {"reservations": [{"name": "nb", "state": "published"}]})
        assert reservations.get(s, "nb").actual_state == "pending"
        desired_state.record_actual(s, nodes.get(s, "gpu-2"), {"reservations": [
            {"name": "nb", "state": "conflict", "reason": "another host answers for jupyter.local"},
            {"name": "nb-elsewhere", "state": "published"}, "garbage"]})
        rsv = reservations.get(s, "nb")
        assert (rsv.actual_state, rsv.actual_reason) == ("conflict", "another host answers for jupyter.local")
        desired_state.record_actual(s, nodes.get(s, "gpu-2"), {"reservations": [{"name": "nb", "state": "on-fire"}]})
        assert reservations.get(s, "nb").actual_state == "error"
        reservations.unassign(s, "nb", actor=ACTOR)
        rsv = reservations.get(s, "nb")
        assert (rsv.state, rsv.node_id, rsv.actual_state) == ("unassigned", None, None)
        assert desired_state.desired_for(s, nodes.get(s, "gpu-2"))["reservations"] == []
    with seeded.sessions() as s:  # type: ignore[attr-defined]
        rsv = reservations.get(s, "nb")
        decided = [(e.from_state, e.to_state, e.actor) for e in audit.history(s, reservations.KIND, [rsv.id])]
        assert decided == [(None, "unassigned", ACTOR), ("unassigned", "assigned", ACTOR),
                           ("assigned", "assigned", ACTOR), ("assigned", "unassigned", ACTOR)]
        reported = [(e.from_state, e.to_state) for e in audit.history(s, reservations.ACTUAL_KIND, [rsv.id])]
        assert reported == [("pending", "mapped"), ("pending", "conflict"), ("conflict", "error")]


def test_remove_frees_name_hostname_and_port(seeded: Store) -> None:
    with seeded.sessions.begin() as s:  # type: ignore[attr-defined]
        reservations.assign(s, "nb", node="gpu-1", actor=ACTOR)
        reservations.remove(s, "nb", actor=ACTOR)
        assert desired_state.desired_for(s, nodes.get(s, "gpu-1"))["reservations"] == []
        again = reservations.add(s, "nb", region="lab-1", hostname="jupyter", port=8888, protocol="udp", actor=ACTOR)
        assert [r.id for r in reservations.list_all(s, "lab-1")] == [again.id]
        # the same hostname and port are free in another region
        reservations.add(s, "nb", region="lab-2", hostname="jupyter", port=8888, actor=ACTOR)
        datastores.remove(s, "share", actor=ACTOR)
        assert datastores.list_all(s) == []


def test_smb_password_is_sealed_and_root_normalised(seeded: Store) -> None:
    with seeded.sessions.begin() as s:  # type: ignore[attr-defined]
        ds = datastores.add(s, "office", region="lab-1", type="smb", address="nas.example.lan",
                            root="/share//dir/.", username="rig", password="s3cret-pw", actor=ACTOR)
        assert ds.root == "/share/dir" and ds.username == "rig"
        assert unseal(ds.sealed_password) == b"s3cret-pw"  # type: ignore[arg-type]
    with seeded.engine.connect() as conn:  # type: ignore[attr-defined]
        dump = repr(list(conn.execute(text("SELECT * FROM datastores"))))
    assert "s3cret-pw" not in dump


def _rsv(**kw: object) -> Callable[[Session], object]:
    args = {"region": "lab-1", "hostname": "web", "port": 9000, "actor": ACTOR, **kw}
    name = args.pop("name", "web")
    return lambda s: reservations.add(s, name, **args)  # type: ignore[arg-type]


def _ds(**kw: object) -> Callable[[Session], object]:
    args = {"region": "lab-1", "type": "nfs", "address": "10.0.0.5", "root": "/srv", "actor": ACTOR, **kw}
    name = args.pop("name", "ds2")
    return lambda s: datastores.add(s, name, **args)  # type: ignore[arg-type]


BAD: list[tuple[str, type[RigbaseError], str, Callable[[Session], object]]] = [
    ("name", InvalidInput, "not a DNS label", _rsv(name="Web_1")),
    ("hostname not a label", InvalidInput, "reservation host name 'web.example'", _rsv(hostname="web.example")),
    ("port low", InvalidInput, "port 80 is out of range", _rsv(port=80)),
    ("port high", InvalidInput, "port 70000", _rsv(port=70000)),
    ("protocol", InvalidInput, "protocol 'sctp'", _rsv(protocol="sctp")),
    ("unknown region", NotFound, "region 'nowhere'", _rsv(region="nowhere")),
    ("duplicate name", Conflict, "name nb is already used", _rsv(name="nb")),
    ("duplicate hostname", Conflict, "hostname jupyter is already used by reservation 'nb'", _rsv(hostname="jupyter")),
    ("duplicate port any protocol", Conflict, "port 8888 is already used", _rsv(port=8888, protocol="udp")),
    ("assign storage", RuleViolation, "is a storage node", lambda s: reservations.assign(s, "nb", node="nas-1", actor=ACTOR)),
    ("assign other region", RuleViolation, "is in region 'lab-2', not 'lab-1'", lambda s: reservations.assign(s, "nb", node="gpu-9", actor=ACTOR)),
    ("assign unknown node", NotFound, "node 'ghost'", lambda s: reservations.assign(s, "nb", node="ghost", actor=ACTOR)),
    ("unassign unassigned", RuleViolation, "is unassigned and cannot go to unassigned", lambda s: reservations.unassign(s, "nb", actor=ACTOR)),
    ("unknown reservation", NotFound, "reservation 'ghost'", lambda s: reservations.remove(s, "ghost", actor=ACTOR)),
    ("ds type", InvalidInput, "datastore type 'ceph'", _ds(type="ceph")),
    ("ds relative root", InvalidInput, "must be an absolute path", _ds(root="srv")),
    ("ds root dotdot", InvalidInput, "contains '..'", _ds(root="/srv/../etc")),
    ("ds address", InvalidInput, "hostname 'bad host'", _ds(address="bad host")),
    ("ds nfs credentials", InvalidInput, "NFS takes no credentials", _ds(username="u", password="p")),
    ("ds smb no credentials", InvalidInput, "SMB needs --username and --password-file", _ds(type="smb", root="/share")),
    ("ds smb root slash", InvalidInput, "starts with the share name", _ds(type="smb", root="/", username="u", password="p")),
    ("ds duplicate", Conflict, "datastore 'share' already exists", _ds(name="share")),
    ("ds unknown", NotFound, "datastore 'ghost'", lambda s: datastores.remove(s, "ghost", actor=ACTOR)),
]


def test_bad_input_is_refused_and_changes_nothing(seeded: Store) -> None:
    """Every case in one test per backend (one seeded database, a snapshot compare after each)."""
    before = seeded.snapshot()
    for label, error, fragment, call in BAD:
        with pytest.raises(error) as err, seeded.sessions.begin() as s:  # type: ignore[attr-defined]
            call(s)
        assert fragment in err.value.message, (label, err.value.message)
        assert "\n" not in err.value.message, label  # one line (the node-side path rules phrase their own)
        assert seeded.snapshot() == before, label
