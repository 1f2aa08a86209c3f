"""A job's reservation moves with the job, in the store on SQLite AND PostgreSQL: while the job's
worker 0 is placed on a node, that node's desired state carries the reservation exactly as an operator
assignment would (so its minion publishes HOST.local); a re-placement moves it to the new node, a stop takes
it off; `reservation show` names the job and the node and trusts a report only from the node serving it
now. `expose_wan` (LAN-only by default) travels in the desired entry. Everything goes through the services
(jobs.create / requeue_or_fail / place_waiting / stop, the heartbeat's desired_for / record_actual)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from contracts.errors import Conflict
from contracts.jobspec import JobSpec
from provisioner.api.routes.reservations import ReservationOut
from provisioner.domain.roles import Principal, Role
from provisioner.domain.states import NodeState
from provisioner.services import beat
from provisioner.services.common import audit
from provisioner.services.fleet import nodes
from provisioner.services.jobs import jobs
from provisioner.services.regions import providers, regions, reservations
from provisioner.store.account_models import Account
from provisioner.store.job_models import Job
from tests.fixtures.postgres import Store

ACTOR = "operator:test"
T4 = {
    "pci_address": "0000:01:00.0",
    "vendor_id": "10de",
    "device_id": "1eb8",
    "vendor": "NVIDIA",
    "name": "T4",
    "model": "T4",
    "gpu_class": "datacenter",
}
NB = {"name": "nb", "hostname": "notebook", "port": 8888, "protocol": "tcp"}


def _root(session: Session) -> Principal:
    account = session.scalar(select(Account).where(Account.name == "default"))
    assert account is not None
    return Principal(actor=ACTOR, account_id=account.id, role=Role.ADMIN, root=account.root)


@pytest.fixture
def seeded(store: Store, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Store:
    """Region lab-1 (the root account's) with two active T4 nodes and reservation `nb` exposed on the WAN."""
    monkeypatch.setenv("RIGBASE_HOME", str(tmp_path / "home"))
    with store.sessions.begin() as s:  # type: ignore[attr-defined]
        providers.enable(s, "physical", {}, actor=ACTOR)
        regions.create(s, "lab-1", provider="physical", actor=ACTOR)
        for i, name in enumerate(("gpu-1", "gpu-2")):
            node = nodes.add(s, name, region="lab-1", minion_id=f"{i + 1:032x}", actor=ACTOR)
            for state in (NodeState.ENROLLING, NodeState.PROVISIONING, NodeState.ACTIVE):
                nodes.transition(s, node, state, actor="minion:test")
            inventory = {
                "hostname": name,
                "cpu": {"physical_cores": 8, "threads": 16},
                "memory_total_bytes": 64 * 2**30,
                "tpm": {"present": True},
                "gpus": [T4],
            }
            nodes.record_report(s, node, inventory=inventory, requirements={"ok": True, "rules": []})
        reservations.add(
            s, "nb", region="lab-1", hostname="notebook", port=8888, expose_wan=True, actor=ACTOR
        )
    return store


def _endpoint(name: str) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": name,
            "type": "endpoint",
            "resources": {"gpu_count": 1, "gpu_types": ["T4"]},
            "workers": ["python -m http.server 8888"],
            "environment": {"image": "localhost/rigbase-job:test"},
            "reservation": "nb",
        }
    )


def _desired(s: Session, node: str) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = beat.desired_for(s, nodes.get(s, node))["reservations"]
    return result


def _shown(s: Session) -> ReservationOut:
    rsv = reservations.get(s, "nb")
    return ReservationOut.of(rsv, reservations.serving_jobs(s, [rsv]).get(rsv.id))


def test_the_reservation_moves_with_its_job_and_leaves_when_it_stops(seeded: Store) -> None:
    with seeded.sessions.begin() as s:  # type: ignore[attr-defined]
        job = jobs.create(s, _root(s), _endpoint("serve-nb")).job
        assert job is not None and job.state == "starting" and job.node is not None
        first = job.node.name
        other = "gpu-2" if first == "gpu-1" else "gpu-1"
        job_id = job.id
        # the node running worker 0 publishes it, exactly as if an operator had assigned it there
        assert _desired(s, first) == [{**NB, "expose_wan": True}]
        assert _desired(s, other) == []
        shown = _shown(s)
        assert (shown.node, shown.job, shown.state, shown.desired.state) == (
            first,
            "serve-nb",
            "pending",
            "unassigned",
        )
        # an operator cannot assign it elsewhere while the job holds it: two nodes would answer
        with pytest.raises(Conflict, match="used by job 'serve-nb'"):
            reservations.assign(s, "nb", node=other, actor=ACTOR)
    with seeded.sessions.begin() as s:  # type: ignore[attr-defined]
        report = {
            "name": "nb",
            "state": "mapped",
            "mdns": "published",
            "upnp": "mapped",
            "address": "10.0.0.7",
            "external_address": "198.51.100.4:8888",
        }
        beat.record_actual(s, nodes.get(s, first), {"reservations": [report]})
        shown = _shown(s)
        assert (shown.state, shown.actual.address, shown.actual.external_address) == (
            "mapped",
            "10.0.0.7",
            "198.51.100.4:8888",
        )
    with seeded.sessions.begin() as s:  # type: ignore[attr-defined]
        # the first node is lost before the job started: the job is re-queued and placed on the other node
        job = s.get(Job, job_id)
        assert job is not None
        jobs.requeue_or_fail(s, job, nodes.get(s, first), why="node lost", actor="reconciler")
        assert job.state == "waiting" and _desired(s, first) == []
        nodes.maintenance(s, first, "on", actor=ACTOR)  # so the placement takes the other node
        jobs.place_waiting(s, job, actor="reconciler")
        assert job.state == "starting" and job.node_id == nodes.get(s, other).id
        assert _desired(s, other) == [{**NB, "expose_wan": True}] and _desired(s, first) == []
        shown = _shown(s)
        # the first node's report no longer describes it: pending until the new node reports
        assert (shown.node, shown.state, shown.actual.state, shown.actual.address) == (
            other,
            "pending",
            None,
            None,
        )
        # a late report of the node it left changes nothing
        late = {"reservations": [{"name": "nb", "state": "error"}]}
        beat.record_actual(s, nodes.get(s, first), late)
        assert _shown(s).state == "pending"
    with seeded.sessions.begin() as s:  # type: ignore[attr-defined]
        jobs.stop(s, _root(s), "serve-nb")
        assert _desired(s, other) == [] and _desired(s, first) == []
        shown = _shown(s)
        assert (shown.node, shown.job, shown.state, shown.actual.state) == (None, None, "unassigned", None)
        # free again: an operator may assign it now
        nodes.maintenance(s, first, "off", actor=ACTOR)
        reservations.assign(s, "nb", node=first, actor=ACTOR)
        assert _desired(s, first) == [{**NB, "expose_wan": True}]


def test_expose_wan_defaults_off_flows_to_the_node_and_is_audited(seeded: Store) -> None:
    with seeded.sessions.begin() as s:  # type: ignore[attr-defined]
        lan = reservations.add(s, "lan", region="lab-1", hostname="lan", port=9000, actor=ACTOR)
        assert lan.expose_wan is False  # LAN-only unless asked
        reservations.assign(s, "lan", node="gpu-1", actor=ACTOR)
        assert _desired(s, "gpu-1") == [
            {"name": "lan", "hostname": "lan", "port": 9000, "protocol": "tcp", "expose_wan": False}
        ]
        reservations.set_expose_wan(s, "lan", expose_wan=True, actor=ACTOR)
        assert _desired(s, "gpu-1")[0]["expose_wan"] is True
        assert reservations.get(s, "lan").actual_state == "pending"  # the node re-reports with the mapping
        reservations.set_expose_wan(s, "lan", expose_wan=True, actor=ACTOR)  # no change: no audit line
        reservations.set_expose_wan(s, "lan", expose_wan=False, actor=ACTOR)
        assert _desired(s, "gpu-1")[0]["expose_wan"] is False
        shown = ReservationOut.of(reservations.get(s, "lan"))
        assert (shown.expose_wan, shown.desired.expose_wan) == (False, False)
        rsv = reservations.get(s, "lan")
        reasons = [e.reason for e in audit.history(s, reservations.KIND, [rsv.id])]
        assert reasons[0] is not None and reasons[0].endswith("LAN-only")
        assert reasons[-2:] == ["now exposed on the WAN (UPnP)", "now LAN-only"]
