"""Reservations and datastores in the store, on SQLite AND PostgreSQL: rules, states, audit, the
desired-state seam (contributor + reporter), and bad input leaving no partial state."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from contracts.errors import Conflict, InvalidInput, NotFound, RigbaseError, RuleViolation
from contracts.regional import ReportedState as NodeActualState
from provisioner.domain.states import ActualState, NodeState
from provisioner.services import beat
from provisioner.services.common import audit
from provisioner.services.common.runtime import runtime_of
from provisioner.services.data import datastores
from provisioner.services.fleet import nodes, region_removal
from provisioner.services.regions import providers, regions, reservations
from provisioner.store.models import Region
from provisioner.store.regional_models import Datastore, Reservation
from tests.fixtures.postgres import Store

ACTOR = "operator:test"
MID = [f"{i:032x}" for i in range(1, 20)]


@pytest.fixture
def seeded(store: Store, tmp_path, monkeypatch: pytest.MonkeyPatch) -> Store:
    monkeypatch.setenv("RIGBASE_HOME", str(tmp_path / "home"))  # the secrets key lives here
    with store.sessions.begin() as s:  # type: ignore[attr-defined]
        providers.enable(s, "physical", {}, actor=ACTOR)
        regions.create(s, "lab-1", provider="physical", storage_mode="central", actor=ACTOR)
        regions.create(s, "lab-2", provider="physical", actor=ACTOR)
        # a central region: its storage node first, serving (active) before compute nodes join it
        nas = nodes.add(s, "nas-1", region="lab-1", minion_id=MID[2], service="storage", actor=ACTOR)
        for state in (NodeState.ENROLLING, NodeState.PROVISIONING, NodeState.ACTIVE):
            nodes.transition(s, nas, state, actor="minion:test")
        nodes.add(s, "gpu-1", region="lab-1", minion_id=MID[0], actor=ACTOR)
        nodes.add(s, "gpu-2", region="lab-1", minion_id=MID[1], actor=ACTOR, upnp=False)
        nodes.add(s, "gpu-9", region="lab-2", minion_id=MID[3], actor=ACTOR)
        reservations.add(s, "nb", region="lab-1", hostname="jupyter", port=8888, actor=ACTOR)
        datastores.add(
            s, "share", region="lab-1", type="nfs", address="10.0.0.5", root="/srv/data", actor=ACTOR
        )
    return store


def test_actual_states_cover_every_state_the_node_reports() -> None:
    assert {s.value for s in NodeActualState} <= {s.value for s in ActualState}


def test_assign_reaches_desired_state_and_the_report_is_kept_apart(seeded: Store) -> None:
    with seeded.sessions.begin() as s:  # type: ignore[attr-defined]
        rsv = reservations.assign(s, "nb", node="gpu-1", actor=ACTOR)
        assert (rsv.state, rsv.actual_state) == ("assigned", "pending")
        gpu1, gpu2 = nodes.get(s, "gpu-1"), nodes.get(s, "gpu-2")
        desired = beat.desired_for(s, gpu1)
        assert desired["reservations"] == [
            {"name": "nb", "hostname": "jupyter", "port": 8888, "protocol": "tcp", "expose_wan": False}
        ]
        assert desired["upnp"] is True and beat.desired_for(s, gpu2)["upnp"] is False
        assert beat.desired_for(s, gpu2)["reservations"] == []
        beat.record_actual(
            s,
            gpu1,
            {
                "reservations": [
                    {
                        "name": "nb",
                        "state": "mapped",
                        "mdns": "published",
                        "upnp": "mapped",
                        "address": "10.0.0.7",
                        "external_address": "198.51.100.4:8888",
                        "reason": None,
                    }
                ],
                "from-a-newer-minion": 1,
            },
        )
    with seeded.sessions.begin() as s:  # type: ignore[attr-defined]
        rsv = reservations.get(s, "nb")
        assert (rsv.state, rsv.actual_state, rsv.address, rsv.external_address) == (
            "assigned",
            "mapped",
            "10.0.0.7",
            "198.51.100.4:8888",
        )
        # move: the old node's late report must not overwrite the new assignment
        reservations.assign(s, "nb", node="gpu-2", actor=ACTOR)
        beat.record_actual(s, nodes.get(s, "gpu-1"), {"reservations": [{"name": "nb", "state": "published"}]})
        assert reservations.get(s, "nb").actual_state == "pending"
        beat.record_actual(
            s,
            nodes.get(s, "gpu-2"),
            {
                "reservations": [
                    {"name": "nb", "state": "conflict", "reason": "another host answers for jupyter.local"},
                    {"name": "nb-elsewhere", "state": "published"},
                    "garbage",
                ]
            },
        )
        rsv = reservations.get(s, "nb")
        assert (rsv.actual_state, rsv.actual_reason) == ("conflict", "another host answers for jupyter.local")
        beat.record_actual(s, nodes.get(s, "gpu-2"), {"reservations": [{"name": "nb", "state": "on-fire"}]})
        assert reservations.get(s, "nb").actual_state == "error"
        reservations.unassign(s, "nb", actor=ACTOR)
        rsv = reservations.get(s, "nb")
        assert (rsv.state, rsv.node_id, rsv.actual_state) == ("unassigned", None, None)
        assert beat.desired_for(s, nodes.get(s, "gpu-2"))["reservations"] == []
    with seeded.sessions() as s:  # type: ignore[attr-defined]
        rsv = reservations.get(s, "nb")
        decided = [(e.from_state, e.to_state, e.actor) for e in audit.history(s, reservations.KIND, [rsv.id])]
        assert decided == [
            (None, "unassigned", ACTOR),
            ("unassigned", "assigned", ACTOR),
            ("assigned", "assigned", ACTOR),
            ("assigned", "unassigned", ACTOR),
        ]
        reported = [(e.from_state, e.to_state) for e in audit.history(s, reservations.ACTUAL_KIND, [rsv.id])]
        assert reported == [("pending", "mapped"), ("pending", "conflict"), ("conflict", "error")]


def test_remove_frees_name_hostname_and_port(seeded: Store) -> None:
    with seeded.sessions.begin() as s:  # type: ignore[attr-defined]
        reservations.assign(s, "nb", node="gpu-1", actor=ACTOR)
        reservations.remove(s, "nb", actor=ACTOR)
        assert beat.desired_for(s, nodes.get(s, "gpu-1"))["reservations"] == []
        again = reservations.add(
            s, "nb", region="lab-1", hostname="jupyter", port=8888, protocol="udp", actor=ACTOR
        )
        assert [r.id for r in reservations.list_all(s, "lab-1")] == [again.id]
        # the same hostname and port are free in another region
        reservations.add(s, "nb", region="lab-2", hostname="jupyter", port=8888, actor=ACTOR)
        datastores.remove(s, "share", actor=ACTOR)
        assert datastores.list_all(s) == []


def test_smb_password_is_sealed_and_root_normalised(seeded: Store) -> None:
    with seeded.sessions.begin() as s:  # type: ignore[attr-defined]
        ds = datastores.add(
            s,
            "office",
            region="lab-1",
            type="smb",
            address="nas.example.lan",
            root="/share//dir/.",
            username="rig",
            password="s3cret-pw",
            actor=ACTOR,
        )
        assert ds.root == "/share/dir" and ds.username == "rig"
        assert runtime_of(s).sealer.unseal(ds.sealed_password) == b"s3cret-pw"  # type: ignore[arg-type]
    with seeded.engine.connect() as conn:  # type: ignore[attr-defined]
        dump = repr(list(conn.execute(text("SELECT * FROM datastores"))))
    assert "s3cret-pw" not in dump


def test_datastore_address_is_stored_in_its_canonical_form(seeded: Store) -> None:
    with seeded.sessions.begin() as s:  # type: ignore[attr-defined]
        v6 = datastores.add(
            s, "v6", region="lab-1", type="nfs", address="2001:DB8:0:0::0:1", root="/export", actor=ACTOR
        )
        assert v6.address == "2001:db8::1"
        with pytest.raises(InvalidInput, match="lowercase"):
            datastores.add(s, "upper", region="lab-1", type="nfs", address="NAS.lan", root="/x", actor=ACTOR)


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
    (
        "hostname not a label",
        InvalidInput,
        "reservation host name 'web.example'",
        _rsv(hostname="web.example"),
    ),
    ("port low", InvalidInput, "port 0 is out of range", _rsv(port=0)),
    ("port high", InvalidInput, "port 70000", _rsv(port=70000)),
    ("protocol", InvalidInput, "protocol 'sctp'", _rsv(protocol="sctp")),
    ("unknown region", NotFound, "region 'nowhere'", _rsv(region="nowhere")),
    ("duplicate name", Conflict, "name nb is already used", _rsv(name="nb")),
    (
        "duplicate hostname",
        Conflict,
        "hostname jupyter is already used by reservation 'nb'",
        _rsv(hostname="jupyter"),
    ),
    ("duplicate port any protocol", Conflict, "port 8888 is already used", _rsv(port=8888, protocol="udp")),
    (
        "assign storage",
        RuleViolation,
        "is a storage node",
        lambda s: reservations.assign(s, "nb", node="nas-1", actor=ACTOR),
    ),
    (
        "assign other region",
        RuleViolation,
        "is in region 'lab-2', not 'lab-1'",
        lambda s: reservations.assign(s, "nb", node="gpu-9", actor=ACTOR),
    ),
    (
        "assign unknown node",
        NotFound,
        "node 'ghost'",
        lambda s: reservations.assign(s, "nb", node="ghost", actor=ACTOR),
    ),
    (
        "unassign unassigned",
        RuleViolation,
        "is unassigned and cannot go to unassigned",
        lambda s: reservations.unassign(s, "nb", actor=ACTOR),
    ),
    (
        "unknown reservation",
        NotFound,
        "reservation 'ghost'",
        lambda s: reservations.remove(s, "ghost", actor=ACTOR),
    ),
    ("ds type", InvalidInput, "datastore type 'ceph'", _ds(type="ceph")),
    ("ds relative root", InvalidInput, "must be an absolute path", _ds(root="srv")),
    ("ds root dotdot", InvalidInput, "contains '..'", _ds(root="/srv/../etc")),
    ("ds address", InvalidInput, "hostname 'bad host'", _ds(address="bad host")),
    ("ds nfs credentials", InvalidInput, "NFS takes no credentials", _ds(username="u", password="p")),
    (
        "ds smb no credentials",
        InvalidInput,
        "SMB needs --username and --password-file",
        _ds(type="smb", root="/share"),
    ),
    (
        "ds smb root slash",
        InvalidInput,
        "starts with the share name",
        _ds(type="smb", root="/", username="u", password="p"),
    ),
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


def _last_decision(s: Session, name: str) -> tuple[str | None, str, str | None]:
    rsv = next(
        r
        for r in s.scalars(
            select(Reservation).where(Reservation.name == name).order_by(Reservation.created_at)
        )
    )
    last = audit.history(s, reservations.KIND, [rsv.id])[-1]
    return last.from_state, last.to_state, last.reason


def test_node_removal_unassigns_the_reservations_it_served(seeded: Store) -> None:
    with seeded.sessions.begin() as s:  # type: ignore[attr-defined]
        reservations.add(s, "api", region="lab-1", hostname="api", port=9000, actor=ACTOR)
        reservations.add(s, "db", region="lab-1", hostname="db", port=5432, actor=ACTOR)
        reservations.assign(s, "nb", node="gpu-1", actor=ACTOR)
        reservations.assign(s, "api", node="gpu-1", actor=ACTOR)
        reservations.assign(s, "db", node="gpu-2", actor=ACTOR)
        beat.record_actual(
            s,
            nodes.get(s, "gpu-1"),
            {"reservations": [{"name": "nb", "state": "published", "address": "10.0.0.7"}]},
        )
    with seeded.sessions.begin() as s:  # type: ignore[attr-defined]
        nodes.remove(s, "gpu-1", actor=ACTOR)
    with seeded.sessions() as s:  # type: ignore[attr-defined]
        for name in ("nb", "api"):
            rsv = reservations.get(s, name)
            assert (rsv.state, rsv.node_id, rsv.actual_state, rsv.address) == (
                "unassigned",
                None,
                None,
                None,
            ), name
            assert _last_decision(s, name) == ("assigned", "unassigned", "node 'gpu-1' was removed")
        assert (reservations.get(s, "db").state, reservations.get(s, "db").node.name) == ("assigned", "gpu-2")
        # unassigned, not stuck: the operator can place them again on a live node
        assert reservations.assign(s, "nb", node="gpu-2", actor=ACTOR).node.name == "gpu-2"


def test_node_removal_and_its_unassignments_are_one_transaction(seeded: Store) -> None:
    with seeded.sessions.begin() as s:  # type: ignore[attr-defined]
        reservations.assign(s, "nb", node="gpu-1", actor=ACTOR)
    before = seeded.snapshot()
    with pytest.raises(RuntimeError), seeded.sessions.begin() as s:  # type: ignore[attr-defined]
        nodes.remove(s, "gpu-1", actor=ACTOR)
        assert reservations.get(s, "nb").state == "unassigned"
        raise RuntimeError("the request failed after the removal")
    assert seeded.snapshot() == before


def test_region_removal_is_refused_while_it_holds_reservations_or_datastores(seeded: Store) -> None:
    with seeded.sessions.begin() as s:  # type: ignore[attr-defined]
        regions.create(s, "lab-3", provider="physical", actor=ACTOR)
        reservations.add(s, "nb", region="lab-3", hostname="jupyter", port=8888, actor=ACTOR)
        datastores.add(s, "scratch", region="lab-3", type="nfs", address="10.0.0.6", root="/srv", actor=ACTOR)
    before = seeded.snapshot()
    for ref in ("lab-3", "lab-1"):
        with pytest.raises(Conflict) as err, seeded.sessions.begin() as s:  # type: ignore[attr-defined]
            region_removal.remove(s, ref, actor=ACTOR)
        assert "\n" not in err.value.message and "pass --force" in err.value.message
        assert seeded.snapshot() == before, ref
    assert err.value.message == (
        "region 'lab-1' still has 3 node(s) (gpu-1, gpu-2, nas-1); 1 reservation(s) (nb); "
        "1 datastore(s) (share): remove them first, or pass --force to remove them "
        "together with the region"
    )
    with seeded.sessions.begin() as s:  # type: ignore[attr-defined]
        reservations.assign(s, "nb", node="gpu-1", region="lab-1", actor=ACTOR)
    with seeded.sessions.begin() as s:  # type: ignore[attr-defined]
        region_removal.remove(s, "lab-3", actor=ACTOR, force=True)
        region_removal.remove(s, "lab-1", actor=ACTOR, force=True)
    with seeded.sessions() as s:  # type: ignore[attr-defined]
        assert [r.name for r in regions.list_all(s)] == ["lab-2"]
        assert reservations.list_all(s) == [] and datastores.list_all(s) == []
        why = "region 'lab-1' removed with --force"
        rows = {
            r.name: r
            for r in s.scalars(select(Reservation).join(Reservation.region).where(Region.name == "lab-1"))
        }
        assert (rows["nb"].state, rows["nb"].node_id) == ("removed", None)
        assert [
            (e.from_state, e.to_state, e.reason) for e in audit.history(s, reservations.KIND, [rows["nb"].id])
        ][-1] == ("assigned", "removed", why)
        share = s.scalar(select(Datastore).where(Datastore.name == "share"))
        assert [(e.to_state, e.reason) for e in audit.history(s, datastores.KIND, [share.id])][-1] == (
            "removed",
            why,
        )
        scratch = s.scalar(select(Datastore).where(Datastore.name == "scratch"))
        assert (scratch.state, audit.history(s, datastores.KIND, [scratch.id])[-1].reason) == (
            "removed",
            "region 'lab-3' removed with --force",
        )
        # the names are free again
        regions.create(s, "lab-3", provider="physical", actor=ACTOR)
        reservations.add(s, "nb", region="lab-3", hostname="jupyter", port=8888, actor=ACTOR)
