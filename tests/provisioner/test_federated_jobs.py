"""Federated jobs: a project's owner
shares it with another account, whose member creates a job in it as OWNER/PROJECT. The job is the
project's (the owner's private regions and usage-fee price apply), its creator is the sharee: the creator
sees the jobs it created there, the owner every job of its project, a third account nothing (404).
Metering charges the creator the federated fee per worker-hour (training 2.65, inference 1.85) and the
project owner the usage fee.

The HTTP half runs against a real `provision serve` and the real CLI (tests/provisioner/test_jobs_api.py's
fleet); the metering half drives jobs through the jobs service and the node's reports, walks the metering
reconciler with a manual clock, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from contracts.jobspec import JobSpec
from provisioner.domain import billing_rules as rules
from provisioner.domain.roles import Principal
from provisioner.services.accounts import accounts, projects
from provisioner.services.billing import ledger
from provisioner.services.fleet import nodes
from provisioner.services.jobs import job_assignments, jobs
from provisioner.services.regions import providers
from provisioner.services.regions import regions as region_service
from provisioner.store.account_models import ProjectShare
from provisioner.store.job_models import Job
from tests.fixtures.control_plane import PROVISION
from tests.fixtures.postgres import Store
from tests.provisioner.test_billing_ledger import ACTOR, active_a100_node, principal_named
from tests.provisioner.test_jobs_api import Fleet, create, mine, report, running_fleet, spec

SHARED = "default/shared-lab"  # the root account `default` owns project `shared-lab`


# ----------------------------------------------------------------------------- over HTTP


def _cli(fleet: Fleet, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**fleet.cp.env, "RIGBASE_TOKEN": token}
    return subprocess.run([str(PROVISION), *args], env=env, capture_output=True, text=True, timeout=60)


def _ok(fleet: Fleet, token: str, *args: str) -> str:
    out = _cli(fleet, token, *args)
    assert out.returncode == 0, (args, out.stdout, out.stderr)
    return out.stdout


def _refused(fleet: Fleet, token: str, *args: str) -> str:
    """One line on stderr, a non-zero exit code, nothing on stdout."""
    out = _cli(fleet, token, *args)
    assert out.returncode != 0 and out.stderr.count("\n") == 1 and not out.stdout, (args, out)
    return out.stderr


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """test_jobs_api's fleet (root owns the private region lab-1; account `other` with an admin token)
    plus a third account with its own admin token (`Fleet.credentials["third"]`)."""
    with running_fleet(tmp_path_factory.mktemp("federated") / "home") as f:
        with f.http() as http:
            assert http.post("/v1/accounts", json={"name": "third"}).status_code == 201
            answer = http.post("/v1/operator-tokens", json={"name": "third-admin", "account": "third"})
            assert answer.status_code == 201, answer.text
            f.credentials["third"] = answer.json()["token"]
            answer = http.post("/v1/operator-tokens", json={"name": "root-dev", "role": "member"})
            assert answer.status_code == 201, answer.text
            f.credentials["root-member"] = answer.json()["token"]
        yield f


def _shares(fleet: Fleet) -> int:
    with fleet.sessions() as s:
        return len(list(s.scalars(select(ProjectShare))))


def test_sharing_refusals_are_one_line_and_store_nothing(fleet: Fleet) -> None:
    root, other, third = fleet.cp.token, fleet.other_token, fleet.credentials["third"]
    _ok(fleet, root, "project", "create", "shared-lab", "-d", "shared with other")
    for token, args, words in [
        (root, ("--account", "nosuch"), "account 'nosuch' does not exist"),
        (root, ("--account", "default"), "already belongs to account 'default'"),
        (other, ("--account", "third"), "does not exist"),  # `shared-lab` of its own: there is none
        (fleet.credentials["root-member"], ("--account", "other"), "may not share projects"),
    ]:
        assert words in _refused(fleet, token, "project", "share", "shared-lab", *args)
    assert _shares(fleet) == 0
    _ok(fleet, root, "project", "share", "shared-lab", "--account", "other")
    assert "already shared with account 'other'" in _refused(
        fleet, root, "project", "share", "shared-lab", "--account", "other"
    )
    # the sharee names it OWNER/PROJECT but cannot pass it on; a third account does not see it at all
    assert "only its admins can share" in _refused(
        fleet, other, "project", "share", SHARED, "--account", "third"
    )
    assert _shares(fleet) == 1
    shown = json.loads(_ok(fleet, root, "project", "show", "shared-lab", "--json"))
    assert shown["shared_with"] == ["other"] and not shown["shared"]
    listed = {p["ref"]: p for p in json.loads(_ok(fleet, other, "project", "list", "--json"))}
    assert listed[SHARED]["shared"] and listed[SHARED]["account"] == "default"
    assert listed[SHARED]["shared_with"] == []  # who else it is shared with is the owner's business
    assert json.loads(_ok(fleet, other, "project", "show", SHARED, "--json"))["id"] == shown["id"]
    missing = _refused(fleet, third, "project", "show", "default/nothing-here")
    assert _refused(fleet, third, "project", "show", SHARED) == missing.replace("nothing-here", "shared-lab")
    with fleet.http(third) as http:
        assert http.get(f"/v1/projects/{shown['id']}").status_code == 404


def test_a_sharee_job_runs_on_the_owners_private_region_and_each_side_sees_what_it_should(
    fleet: Fleet, tmp_path: Path
) -> None:
    root, other, third = fleet.cp.token, fleet.other_token, fleet.credentials["third"]
    assert _shares(fleet) == 1, "runs after test_sharing_refusals_are_one_line_and_store_nothing"
    spec_file = tmp_path / "job.json"
    spec_file.write_text(json.dumps(spec("fed-train")))
    _ok(fleet, other, "job", "create", "-f", str(spec_file), "--project", SHARED, "--yes")
    with fleet.http(other) as http:
        (mine_now,) = http.get("/v1/jobs").json()["items"]
        # lab-1 is the owner's private region: the sharee's own jobs wait there (test_jobs_api), this one
        # is the project's and runs at the owner's usage fee (RTX 3090: 0.05)
        assert mine_now["name"] == "fed-train" and mine_now["state"] == "starting", mine_now
        assert mine_now["region"] == "lab-1" and mine_now["price_per_gpu_hour"] == 0.05
        assert mine_now["project"] == "shared-lab" and mine_now["federated"]
        other_id = http.get("/v1/accounts").json()["items"][0]["id"]
        assert mine_now["account_id"] == other_id
        assert [j["id"] for j in http.get("/v1/jobs", params={"project": SHARED}).json()["items"]] == [
            mine_now["id"]
        ]
    job_id = mine_now["id"]
    (w,) = mine(fleet.heartbeat("gpu-1"), job_id)
    fleet.heartbeat("gpu-1", [report(w, "running")])
    assert fleet.log("gpu-1", job_id, 0, 0, "federated output\n").status_code == 200
    # the owner's own job in the same project is not federated; the sharee does not see it
    own = create(fleet, spec("owner-job", types=("T4",)), project="shared-lab")
    assert own.status_code == 201 and not own.json()["federated"], own.text
    with fleet.http(root) as http:
        in_project = http.get("/v1/jobs", params={"project": "shared-lab"}).json()["items"]
        assert sorted(j["name"] for j in in_project) == ["fed-train", "owner-job"]
        assert "federated output" in http.get(f"/v1/jobs/{job_id}/logs").text
    with fleet.http(other) as http:
        assert [j["name"] for j in http.get("/v1/jobs").json()["items"]] == ["fed-train"]
        assert http.get(f"/v1/jobs/{own.json()['id']}").status_code == 404
        for path in (f"/v1/jobs/{job_id}", f"/v1/jobs/{job_id}/history", f"/v1/jobs/{job_id}/logs"):
            assert http.get(path).status_code == 200, path
        assert "federated output" in http.get(f"/v1/jobs/{job_id}/logs").text
    with fleet.http(third) as http:
        assert http.get("/v1/jobs").json()["items"] == []
        for method, path in [
            ("GET", f"/v1/jobs/{job_id}"),
            ("GET", f"/v1/jobs/{job_id}/history"),
            ("GET", f"/v1/jobs/{job_id}/logs"),
            ("POST", f"/v1/jobs/{job_id}/stop"),
        ]:
            answer = http.request(method, path, json={} if method == "POST" else None)
            assert answer.status_code == 404 and "federated" not in answer.text, (method, path, answer.text)
        assert create(fleet, spec("gate-crash"), third, project=SHARED).status_code == 404
    # unsharing: no new job of the sharee there; the one it created stays its own to see and stop
    _ok(fleet, root, "project", "unshare", "shared-lab", "--account", "other")
    assert "is not shared with account 'other'" in _refused(
        fleet, root, "project", "unshare", "shared-lab", "--account", "other"
    )
    assert create(fleet, spec("too-late"), other, project=SHARED).status_code == 404
    with fleet.http(other) as http:
        stopped = http.post(f"/v1/jobs/{job_id}/stop")
        assert stopped.status_code == 200, stopped.text
    (w,) = mine(fleet.heartbeat("gpu-1"), job_id)
    fleet.heartbeat("gpu-1", [report(w, "stopped", exit_code=143)])
    with fleet.http(root) as http:
        assert http.get(f"/v1/jobs/{job_id}").json()["state"] == "stopped"
        http.post(f"/v1/jobs/{own.json()['id']}/stop")
    for w in mine(fleet.heartbeat("gpu-2"), own.json()["id"]):
        fleet.heartbeat("gpu-2", [report(w, "stopped", exit_code=143)])


# ----------------------------------------------------------------------------- metering


def _world(sessions: sessionmaker[Session]) -> tuple[Principal, Principal]:
    """`owner` (a private region with one node of 2 x A100 40GB) shares its default project with `guest`,
    which has no credits."""
    with sessions.begin() as s:
        root = principal_named(s, "default")
        accounts.create(s, root, "owner")
        accounts.create(s, root, "guest")
        owner, guest = principal_named(s, "owner"), principal_named(s, "guest")
        providers.enable(s, "physical", {}, actor=ACTOR)
        region_service.create(s, "own", provider="physical", actor=ACTOR, account_id=owner.account_id)
        active_a100_node(s, "own", 9)
        projects.share(s, owner, "default", "guest")
        return owner, guest


def _job(name: str, job_type: str, workers: int) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": name,
            "type": job_type,
            "resources": {"gpu_count": 1, "gpu_types": ["A100 40GB"]},
            "workers": [f"python serve.py --shard {i}" for i in range(workers)],
            "environment": {"image": "localhost/rigbase-job:test"},
        }
    )


def _start(sessions: sessionmaker[Session], creator: Principal, job: JobSpec, project: str) -> str:
    """The job created through the jobs service and reported running by the node."""
    with sessions.begin() as s:
        submitted = jobs.create(s, creator, job, project=project)
        assert submitted.job is not None and submitted.job.state == "starting", submitted.job
        job_id = submitted.job.id
    _report(sessions, job_id, "running")
    return job_id


def _report(sessions: sessionmaker[Session], job_id: str, state: str, **more: Any) -> None:
    with sessions.begin() as s:
        node = nodes.get(s, "a100-1")
        desired = job_assignments.desired_for_node(s, node)
        reports = [
            {"job_id": job_id, "worker": w["worker"], "generation": w["generation"], "state": state, **more}
            for w in desired["workers"]
            if w["job_id"] == job_id
        ]
        assert reports, desired
        job_assignments.record_actual(s, node, {"workers": reports})


def _paid(session: Session, account: str, job_id: str) -> dict[str, Decimal]:
    """What `account` paid for `job_id`, by rule."""
    out: dict[str, Decimal] = {}
    for row in ledger.entries(session, [account], job_id=job_id):
        if row.payer == account:
            out[row.rule] = out.get(row.rule, Decimal(0)) + rules.from_micros(row.amount_micros)
    return out


def _workers_ran(
    sessions: sessionmaker[Session], job_id: str, started: datetime, ended: datetime | None
) -> None:
    with sessions.begin() as s:
        for worker in s.get_one(Job, job_id).workers:
            worker.started_at = started
            if ended is not None:
                worker.ended_at = ended


@pytest.mark.parametrize(
    ("job_type", "workers", "fee", "creator_total", "owner_total"),
    [
        ("training", 2, Decimal("2.65"), Decimal("13.25"), Decimal("1.25")),  # docs/billing.md's example
        ("inference", 1, Decimal("1.85"), Decimal("4.625"), Decimal("0.625")),
    ],
)
def test_the_creator_pays_the_federated_fee_per_worker_hour_and_the_owner_the_usage_fee(
    store: Store,
    monkeypatch: pytest.MonkeyPatch,
    job_type: str,
    workers: int,
    fee: Decimal,
    creator_total: Decimal,
    owner_total: Decimal,
) -> None:
    from provisioner.domain import clock
    from provisioner.reconcilers import metering as reconciler

    sessions: sessionmaker[Session] = store.sessions  # type: ignore[assignment]
    owner, guest = _world(sessions)
    job_id = _start(sessions, guest, _job("fed", job_type, workers), "owner/default")
    with sessions() as s:
        job = s.get(Job, job_id)
        assert job is not None and job.started_at is not None
        assert job.account_id == guest.account_id and job.project.account_id == owner.account_id
        assert rules.is_federated(job.account_id, job.project.account_id)
        assert job.price_per_gpu_hour == 0.25  # the owner's own A100: the datacenter usage fee
        started = job.started_at
    _workers_ran(sessions, job_id, started, None)  # each worker is billed from its own start
    manual = clock.ManualClock(started)
    monkeypatch.setattr(clock, "CLOCK", manual)
    manual.advance(timedelta(hours=2, minutes=1))
    reconciler.run_once(sessions)
    assert reconciler.run_once(sessions) == 0  # a repeated pass adds nothing
    usage = Decimal("0.25") * workers  # one A100 per worker
    with sessions() as s:
        assert _paid(s, guest.account_id, job_id) == {"federated_fee": fee * workers * 2}
        assert _paid(s, owner.account_id, job_id) == {"usage_fee": usage * 2}
        # own capacity needs no credits: both balances go below zero (docs/billing.md "Balances")
        assert ledger.balance(s, guest.account_id) == -fee * workers * 2
        assert ledger.balance(s, owner.account_id) == -usage * 2
        assert sum(ledger.balances(s).values(), Decimal(0)) == 0
    with sessions.begin() as s:
        jobs.stop(s, guest, job_id)
    _report(sessions, job_id, "stopped", exit_code=143)
    with sessions.begin() as s:
        job = s.get(Job, job_id)
        assert job is not None and job.state == "stopped"
        job.ended_at = started + timedelta(hours=2, minutes=30)  # the stop came half an hour into hour 3
    _workers_ran(sessions, job_id, started, started + timedelta(hours=2, minutes=30))
    manual.advance(timedelta(minutes=30))
    reconciler.run_once(sessions)
    with sessions() as s:
        assert _paid(s, guest.account_id, job_id) == {"federated_fee": fee * workers * Decimal("2.5")}
        assert _paid(s, owner.account_id, job_id) == {"usage_fee": usage * Decimal("2.5")}
        assert ledger.balance(s, guest.account_id) == -creator_total  # 2 hours 30 minutes
        assert ledger.balance(s, owner.account_id) == -owner_total
    # the owner's own job in the same project is not federated: no federated fee for anyone
    own_id = _start(sessions, owner, _job("own", job_type, 1), "default")
    with sessions() as s:
        own = s.get(Job, own_id)
        assert own is not None and own.started_at is not None
        own_start = own.started_at
    manual.advance(own_start + timedelta(hours=1, minutes=1) - manual.now())
    reconciler.run_once(sessions)
    with sessions() as s:
        assert _paid(s, owner.account_id, own_id) == {"usage_fee": Decimal("0.25")}
        assert _paid(s, guest.account_id, own_id) == {}
