"""Burst compute for jobs, in-process: the real store on SQLite,
the real google-cloud-compute client against the Compute REST fake, one reconciler pass at a time.

Placement offers a GCP region's cached quota as candidates next to owned nodes; a job placed there gets a
VM of the right shape (machine type, guest accelerator, TERMINATE, Spot, local SSDs, labels), made once
whatever crashes, with zone fallback; the VM goes when the job ends; a preempted training job is re-queued
once; the reaper deletes only labelled strays; two jobs racing for the last GPU make one VM."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from contracts.jobspec import JobSpec
from provisioner.attestation.refusals import Refusal, RefusalCode
from provisioner.domain.placement import CandidateSource
from provisioner.domain.placement_rows import match_rows
from provisioner.domain.roles import Principal, Role
from provisioner.domain.states import BurstVmState, JobState, NodeState
from provisioner.providers.base import NodeEvent, NodeEventKind
from provisioner.providers.gcp import catalogue, compute_node
from provisioner.reconcilers import gcp_burst as burst_reconciler
from provisioner.reconcilers.loop import ReconcilerLoop
from provisioner.services.cloud import gcp, gcp_burst, gcp_capacity
from provisioner.services.common import audit
from provisioner.services.common.runtime import runtime_of
from provisioner.services.common.wakeups import Wake
from provisioner.services.fleet import join_tokens
from provisioner.services.fleet import nodes as node_service
from provisioner.services.jobs import gcp_events, job_placement, jobs
from provisioner.services.regions import providers as provider_service
from provisioner.services.regions import regions as region_service
from provisioner.store.account_models import Account
from provisioner.store.engine import session_scope
from provisioner.store.gcp_models import GcpBurstVm
from provisioner.store.job_models import Job
from provisioner.store.models import Node
from tests.provisioner.gcp.fake_compute import quota
from tests.provisioner.gcp.published import publish_image
from tests.provisioner.gcp.test_reconcilers import enabled_gcp

T4_ZONES = catalogue.load().region("us-central1").gpu_zones["T4"]
ACTOR = "operator:test"


def world(url: str, tmp_path: Path, fake_compute: Any) -> Iterator[sessionmaker[Session]]:
    """A migrated store at `url` with an enabled gcp provider and GCP region us-central1 (T4 quota: 2)."""
    engine, sessions = enabled_gcp(url, tmp_path, fake_compute)
    with session_scope(sessions) as s:
        gcp.create_region(
            s,
            "us-central1",
            gcp_region=None,
            storage_class="small",
            public_jobs=False,
            dry_run=False,
            actor="test",
        )
    publish_image(sessions, "us-central1", tmp_path / "image-builder")
    yield sessions
    engine.dispose()


@pytest.fixture()
def store(tmp_path: Path, fake_compute: Any) -> Iterator[sessionmaker[Session]]:
    yield from world(f"sqlite:///{tmp_path / 'rigbase.db'}", tmp_path, fake_compute)


@pytest.fixture()
def both_stores(database_url: str, tmp_path: Path, fake_compute: Any) -> Iterator[sessionmaker[Session]]:
    """The same world on SQLite and on PostgreSQL (where the booking lock is a real FOR UPDATE)."""
    yield from world(database_url, tmp_path, fake_compute)


def root(s: Session) -> Principal:
    account = s.scalar(select(Account).where(Account.name == "default"))
    assert account is not None
    return Principal(actor=ACTOR, account_id=account.id, role=Role.ADMIN, root=account.root)


def spec(
    name: str, *, preemptible: bool = False, type_: str = "training", disk: int | None = None
) -> JobSpec:
    resources: dict[str, Any] = {"gpu_count": 1, "gpu_types": ["T4"]}
    if disk is not None:
        resources["disk_size"] = disk
    return JobSpec.model_validate(
        {
            "name": name,
            "type": type_,
            "resources": resources,
            "workers": ["python train.py"],
            "environment": {"image": "localhost/rigbase-job:test"},
            "preemptible": preemptible,
        }
    )


def burst_pass(sessions: sessionmaker[Session]) -> None:
    ReconcilerLoop(sessions, only=[Wake.GCP_BURST], elect=False).run_once()


def create_job(sessions: sessionmaker[Session], job_spec: JobSpec) -> str:
    with session_scope(sessions) as s:
        job = jobs.create(s, root(s), job_spec).job
        assert job is not None
        return job.id


def job_of(sessions: sessionmaker[Session], job_id: str) -> tuple[str, str | None]:
    with session_scope(sessions) as s:
        job = s.get_one(Job, job_id)
        return job.state, job.reason


def vms_of(sessions: sessionmaker[Session], job_id: str) -> list[tuple[str, str, str | None]]:
    with session_scope(sessions) as s:
        rows = s.scalars(
            select(GcpBurstVm).where(GcpBurstVm.job_id == job_id).order_by(GcpBurstVm.created_at)
        )
        return [(vm.instance_name, vm.state, vm.zone) for vm in rows]


def test_placement_offers_the_cached_quota_as_candidates_without_calling_google(
    store: sessionmaker[Session], fake_compute: Any
) -> None:
    with session_scope(store) as s:
        before = [c for c in gcp_capacity.gcp_candidates(s) if c.gpu_type == "T4"]
    assert before and all(c.gpus_free == 0 for c in before), "no quota read yet: nothing offered"
    burst_pass(store)  # reads the quota into the cache
    calls = sum(fake_compute.fake.calls.values())
    with session_scope(store) as s:
        offered = {
            c.name: c
            for c in job_placement.snapshot(s)
            if c.source == CandidateSource.GCP and c.gpu_type == "T4"
        }
    assert sum(fake_compute.fake.calls.values()) == calls, "placement never calls Google"
    on_demand, spot = offered["n1-standard-8 on-demand"], offered["n1-standard-8 spot"]
    # min(2 GPUs, 64 CPUs / 8, 3000 GB / 375) = 2
    assert (on_demand.gpus_free, spot.gpus_free) == (2, 2)
    assert on_demand.region == "us-central1" and on_demand.provider == "gcp" and spot.preemptible
    # Google's price plus the datacenter usage fee (0.25)
    assert on_demand.price_per_gpu_hour == pytest.approx(0.35 + 0.25)
    assert spot.price_per_gpu_hour == pytest.approx(0.14 + 0.25)


def test_a_spot_candidate_is_offered_only_to_a_preemptible_job_and_dry_run_shows_the_price(
    store: sessionmaker[Session], fake_compute: Any
) -> None:
    burst_pass(store)
    with session_scope(store) as s:
        sure = jobs.create(s, root(s), spec("sure"), dry_run=True).decision
        cheap = jobs.create(s, root(s), spec("cheap", preemptible=True), dry_run=True).decision
        assert s.scalar(select(GcpBurstVm)) is None, "a dry run creates nothing"
    assert sure.chosen[0].name == "n1-standard-8 on-demand"
    assert not any(c.preemptible for c in sure.first.ranked)
    assert cheap.chosen[0].name == "n1-standard-8 spot"
    [row, *_] = match_rows(cheap.first)
    assert (row.provider, row.region, row.selected) == ("gcp", "us-central1", True)
    assert row.cost_per_hour == pytest.approx(0.39)
    assert fake_compute.fake.instance_count() == 0


def test_a_job_on_gcp_gets_one_vm_of_the_right_shape_and_it_goes_when_the_job_ends(
    store: sessionmaker[Session], fake_compute: Any
) -> None:
    burst_pass(store)
    job_id = create_job(store, spec("train", preemptible=True, disk=500))
    [(name, vm_state, _)] = vms_of(store, job_id)
    assert job_of(store, job_id)[0] == JobState.STARTING and vm_state == BurstVmState.PENDING
    with session_scope(store) as s:
        assert any(
            f"placed on {name} (us-central1)" in (e.reason or "") for e in jobs.history(s, root(s), job_id)
        )
    burst_pass(store)
    [(_, vm_state, zone)] = vms_of(store, job_id)
    assert vm_state == BurstVmState.CREATED and zone == T4_ZONES[0]
    inst = fake_compute.fake.instances[(zone, name)]
    assert inst["machineType"].endswith("/machineTypes/n1-standard-8")
    [acc] = inst["guestAccelerators"]
    assert (
        acc["acceleratorType"].endswith("/acceleratorTypes/nvidia-tesla-t4") and acc["acceleratorCount"] == 1
    )
    sched = inst["scheduling"]
    assert sched["onHostMaintenance"] == "TERMINATE" and sched["provisioningModel"] == "SPOT"
    assert sched["instanceTerminationAction"] == "DELETE"
    scratch = [d for d in inst["disks"] if d.get("type") == "SCRATCH"]
    assert len(scratch) == 2 and all(d["initializeParams"]["diskSizeGb"] == "375" for d in scratch)
    labels = inst["labels"]
    assert labels["rigbase-managed"] == "rigbase" and labels["rigbase-role"] == "compute"
    assert labels["rigbase-job"] == job_id
    with session_scope(store) as s:
        job = s.get_one(Job, job_id)
        node = s.get_one(Node, job.node_id)
        # the job's worker is on the VM's node, whose EK is pinned so its minion joins as that instance
        assert node.name == name and node.pinned_ek_public is not None and node.state == NodeState.NEW
        assert job.price_per_gpu_hour == pytest.approx(0.39)
    burst_pass(store)  # steady: nothing new
    # the booting VM's node has never reported: the jobs reconciler gives it the grace period to join
    ReconcilerLoop(store, only=[Wake.JOBS], elect=False).run_once()
    assert job_of(store, job_id)[0] == JobState.STARTING
    assert fake_compute.fake.calls["instance_insert"] == 1
    with session_scope(store) as s:
        jobs.stop(s, root(s), job_id)
    burst_pass(store)
    [(_, vm_state, _)] = vms_of(store, job_id)
    assert vm_state == BurstVmState.DELETED and (zone, name) not in fake_compute.fake.instances
    with session_scope(store) as s:
        assert s.get_one(Node, s.get_one(Job, job_id).node_id).state == NodeState.REMOVED
        # the join token the VM was made with (in its metadata) enrols nothing after the VM is gone
        vm = s.scalars(select(GcpBurstVm).where(GcpBurstVm.job_id == job_id)).one()
        refused = join_tokens.resolve(s, runtime_of(s).sealer.unseal(vm.sealed_join_token).decode())
        assert isinstance(refused, Refusal) and refused.code == RefusalCode.join_token_revoked, refused


def test_an_on_demand_a100_vm_attaches_no_accelerator_and_migrates_never() -> None:
    cat = catalogue.load()
    spec_ = compute_node.ComputeNodeSpec(
        vm_id="bvm_1",
        instance_name="rigbase-burst-1",
        job_id="job_1",
        region_id="reg_1",
        region="us-central1",
        gcp_region="us-central1",
        zones=("us-central1-a",),
        gpu=cat.gpus["A100"],
        gpu_count=1,
        local_ssds=1,
        preemptible=False,
        bundle={},
        image="projects/p/global/images/family/rigbase-us-central1",
    )
    inst = compute_node.build_instance(spec_, "p", "us-central1-a")
    assert inst.machine_type.endswith("a2-highgpu-1g") and list(inst.guest_accelerators) == []
    assert (
        inst.scheduling.on_host_maintenance == "TERMINATE"
        and inst.scheduling.provisioning_model == "STANDARD"
    )
    assert spec_.request_id("p", "z") == spec_.request_id("p", "z") != spec_.request_id("p", "y")


def test_zone_stockout_falls_back_and_every_zone_refusing_sends_the_job_back_to_waiting(
    store: sessionmaker[Session], fake_compute: Any
) -> None:
    burst_pass(store)
    fake_compute.fake.zone_errors[T4_ZONES[0]] = "STOCKOUT"
    fake_compute.fake.insert_errors[T4_ZONES[1]] = "QUOTA_EXCEEDED"
    first = create_job(store, spec("first"))
    burst_pass(store)
    [(_, vm_state, zone)] = vms_of(store, first)
    assert vm_state == BurstVmState.CREATED and zone == T4_ZONES[2]
    for z in T4_ZONES:
        fake_compute.fake.zone_errors[z] = "ZONE_RESOURCE_POOL_EXHAUSTED"
    second = create_job(store, spec("second"))
    burst_pass(store)
    [(name, vm_state, _)] = vms_of(store, second)
    state, reason = job_of(store, second)
    assert vm_state == BurstVmState.FAILED and state == JobState.WAITING
    assert (
        reason
        and "no zone of us-central1" in reason
        and f"{T4_ZONES[0]}: ZONE_RESOURCE_POOL_EXHAUSTED" in reason
    )
    assert fake_compute.fake.instance_count(name) == 0
    with session_scope(store) as s:
        # the stockout keeps that type at 0 free for a while: waiting jobs do not ask Google every pass
        spot_or_not = [c for c in gcp_capacity.gcp_candidates(s) if c.gpu_type == "T4" and not c.preemptible]
        assert [c.gpus_free for c in spot_or_not] == [0]
        jobs.place_waiting(s, s.get_one(Job, second), actor="test")
    assert job_of(store, second)[0] == JobState.WAITING and len(vms_of(store, second)) == 1


@pytest.mark.parametrize(
    "route", ["instance_get", "instance_insert", "op_wait", "shielded_identity", "instance_delete"]
)
def test_killed_at_any_step_of_create_and_delete_leaves_one_vm_then_none(
    store: sessionmaker[Session], fake_compute: Any, route: str
) -> None:
    """Compute handles the call, then the control plane dies before it hears the answer (the pass raises
    and nothing after it is recorded); the next passes resume from the store."""
    burst_pass(store)
    job_id = create_job(store, spec("crashy"))
    killed: list[str] = []

    def kill_at(called: str) -> None:
        if called == route and not killed:
            killed.append(called)
            raise ConnectionError("control plane killed before it heard Compute's answer")

    fake = fake_compute.fake
    fake.on_call = kill_at
    burst_pass(store)
    burst_pass(store)
    [(name, vm_state, _)] = vms_of(store, job_id)
    assert vm_state == BurstVmState.CREATED and fake.instance_count(name) == 1
    assert len([o for o in fake._ops.values() if o.op_type == "insert"]) == 1, "one insert operation"
    with session_scope(store) as s:
        assert s.get_one(Node, s.get_one(Job, job_id).node_id).pinned_ek_public is not None
        jobs.stop(s, root(s), job_id)
    burst_pass(store)
    burst_pass(store)
    assert killed == [route]
    assert vms_of(store, job_id)[0][1] == BurstVmState.DELETED and fake.instance_count(name) == 0


def test_two_jobs_racing_for_the_last_gpu_never_make_two_vms(
    both_stores: sessionmaker[Session], fake_compute: Any
) -> None:
    store = both_stores
    fake_compute.fake.region_quotas["us-central1"][2] = quota("NVIDIA_T4_GPUS", 1)
    burst_pass(store)
    # both jobs see the same snapshot: one free T4 on GCP
    with session_scope(store) as s:
        stale = job_placement.snapshot(s)
    a, b = create_job_waiting(store, "race-a"), create_job_waiting(store, "race-b")
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def place(job_id: str) -> None:
        try:
            barrier.wait()
            with session_scope(store) as s:
                jobs.place_waiting(s, s.get_one(Job, job_id), actor="test", candidates=list(stale))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=place, args=(j,)) for j in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    states = sorted([job_of(store, a), job_of(store, b)], key=lambda x: x[0])
    assert [s for s, _ in states] == [JobState.STARTING, JobState.WAITING]
    assert "quota for 0 more T4 VM(s)" in (states[1][1] or "")
    burst_pass(store)
    with session_scope(store) as s:
        assert len(list(s.scalars(select(GcpBurstVm)))) == 1
    assert fake_compute.fake.instance_count() == 1


def create_job_waiting(sessions: sessionmaker[Session], name: str) -> str:
    """A job stored waiting (as if placement had found nothing), for the race above to place."""
    with session_scope(sessions) as s:
        original = job_placement.SOURCES[:]
        job_placement.SOURCES[:] = []
        try:
            job = jobs.create(s, root(s), spec(name)).job
        finally:
            job_placement.SOURCES[:] = original
        assert job is not None and job.state == JobState.WAITING
        return job.id


def test_preemption_requeues_a_training_job_once_and_fails_other_jobs(
    store: sessionmaker[Session], fake_compute: Any
) -> None:
    burst_pass(store)
    train = create_job(store, spec("train", preemptible=True))
    serve = create_job(store, spec("serve", preemptible=True, type_="inference"))
    burst_pass(store)

    def preempt(job_id: str) -> None:
        name, _, zone = vms_of(store, job_id)[-1]
        fake_compute.fake.instances.pop((zone or "", name), None)  # a Spot VM deletes itself
        event = NodeEvent(
            NodeEventKind.OFFLINE, "preempted", name, zone or "", "compute.instances.preempted", "t"
        )
        gcp_events.apply_event(store, event)

    preempt(train)
    state, reason = job_of(store, train)
    assert (
        state == JobState.WAITING
        and "re-queued once after VM" in (reason or "")
        and "preempted" in (reason or "")
    )
    preempt(serve)
    state, reason = job_of(store, serve)
    assert state == JobState.FAILED and "preempted" in (reason or "")
    # the training job is placed again on a new VM (once the preempted VMs are gone and their quota with
    # them), preempted again: now it fails
    burst_pass(store)
    with session_scope(store) as s:
        jobs.place_waiting(s, s.get_one(Job, train), actor="test")
    burst_pass(store)
    assert [v[1] for v in vms_of(store, train)] == [BurstVmState.DELETED, BurstVmState.CREATED]
    preempt(train)
    state, reason = job_of(store, train)
    assert state == JobState.FAILED and "already re-queued 1 time(s)" in (reason or "")
    with session_scope(store) as s:
        events = jobs.history(s, root(s), train)
        assert any("re-queued once after VM" in (e.reason or "") for e in events)


def test_the_reaper_deletes_only_labelled_strays_with_an_audit_line(
    store: sessionmaker[Session], fake_compute: Any
) -> None:
    burst_pass(store)
    kept = create_job(store, spec("kept"))
    burst_pass(store)
    zone = T4_ZONES[0]
    ours = {"rigbase-managed": "rigbase", "rigbase-role": "compute", "rigbase-burst-vm": "bvm_gone"}
    fake = fake_compute.fake
    fake.instances[(zone, "rigbase-burst-stray")] = {"name": "rigbase-burst-stray", "labels": ours}
    fake.instances[(zone, "someone-elses")] = {"name": "someone-elses", "labels": {"team": "ml"}}
    half = {"rigbase-managed": "rigbase", "rigbase-role": "compute"}  # no burst VM id: not one of ours
    fake.instances[(zone, "rigbase-half")] = {"name": "rigbase-half", "labels": half}
    ctx, prefix = burst_reconciler._context(store)
    assert ctx is not None
    reaped = burst_reconciler.reap(store, ctx, prefix)
    burst_pass(store)
    assert reaped == ["rigbase-burst-stray"]
    assert (zone, "someone-elses") in fake.instances and (zone, "rigbase-half") in fake.instances
    [(name, vm_state, vm_zone)] = vms_of(store, kept)
    assert vm_state == BurstVmState.CREATED and (vm_zone, name) in fake.instances
    with session_scope(store) as s:
        [line] = audit.history(s, gcp_burst.KIND, ["bvm_gone"])
        assert "reaped" in (line.reason or "") and "no live job or node owns it" in (line.reason or "")


def test_an_owned_node_of_the_same_class_is_chosen_before_a_burst_vm(
    store: sessionmaker[Session], fake_compute: Any
) -> None:
    burst_pass(store)
    with session_scope(store) as s:
        provider_service.enable(s, "physical", {}, actor=ACTOR)
        region_service.create(s, "lab-1", provider="physical", actor=ACTOR)
        node = node_service.add(s, "gpu-1", region="lab-1", minion_id=f"{1:032x}", actor=ACTOR)
        for state in (NodeState.ENROLLING, NodeState.PROVISIONING, NodeState.ACTIVE):
            node_service.transition(s, node, state, actor="minion:test")
        t4 = {"vendor": "NVIDIA", "name": "T4", "model": "T4", "gpu_class": "datacenter"}
        inventory = {"cpu": {"threads": 16}, "memory_total_bytes": 64 * 2**30, "gpus": [t4]}
        node_service.record_report(s, node, inventory=inventory, requirements={"ok": True, "rules": []})
    first = create_job(store, spec("owned-first", preemptible=True))
    second = create_job(store, spec("then-burst", preemptible=True))
    with session_scope(store) as s:
        owned, burst = s.get_one(Job, first).node, s.get_one(Job, second).node
        assert owned is not None and owned.name == "gpu-1"
        assert burst is not None and burst.name.startswith("rigbase-burst-")
    assert vms_of(store, first) == [] and len(vms_of(store, second)) == 1


def test_dry_run_output_says_a_vm_would_be_rented_and_what_it_costs(
    store: sessionmaker[Session], fake_compute: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from dataclasses import asdict

    from provisioner.cli.jobs import print_match_table

    burst_pass(store)
    with session_scope(store) as s:
        decision = jobs.create(s, root(s), spec("look", preemptible=True), dry_run=True).decision
        ages = gcp_capacity.cache_age_s(s)
    placement = {
        "pinned_region": None,
        "pinned_by": None,
        "matches": [asdict(r) for r in match_rows(decision.first)],
        "rejected": [],
        "rejected_total": 0,
        "waiting_reason": None,
        "gcp_quota_age_s": {"us-central1": ages["us-central1"]},
    }
    print_match_table(placement)
    out = " ".join(capsys.readouterr().out.split())
    assert "n1-standard-8 spot" in out and "0.39" in out and "gcp" in out
    assert "would get a new GCP VM (n1-standard-8 spot) in us-central1" in out
    # the burst pass above read the quota moments ago: the age placement worked from is shown
    age = ages["us-central1"]
    assert age is not None and 0 <= age < 60, ages
    assert (
        "GCP capacity in us-central1 is from its quota read " in out and "s ago (refreshed every 60 s)" in out
    )
    assert fake_compute.fake.calls["instance_insert"] == 0


def test_in_flight_counts_only_what_the_quota_read_does_not_count_yet() -> None:
    """A VM Compute confirmed before the quota was read is in Google's usage already; one confirmed after
    (or not yet) is added, for its GPUs, its family's CPUs and its local SSD."""
    from datetime import UTC, datetime, timedelta

    from provisioner.providers.gcp.capacity import Quota

    cat = catalogue.load()
    read = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)

    def vm(inserted: datetime | None) -> GcpBurstVm:
        return GcpBurstVm(gpu_type="T4", gpu_count=1, cpus=8, local_ssds=2, inserted_at=inserted)

    quotas = {"CPUS": Quota(64, 0), "NVIDIA_T4_GPUS": Quota(2, 1), "LOCAL_SSD_TOTAL_GB": Quota(3000, 0)}
    held = gcp_capacity.in_flight(
        [vm(read - timedelta(seconds=1)), vm(read + timedelta(seconds=1)), vm(None)], read, cat, quotas
    )
    assert held == {"NVIDIA_T4_GPUS": 2, "CPUS": 16, "LOCAL_SSD_TOTAL_GB": 1500}
    view = gcp_capacity.GcpRegionView("r", "us-central1", None, False, "gcp", "us-central1", quotas, read)
    assert gcp_capacity.runnable(view, cat.gpus["T4"], {}) == 1
    assert gcp_capacity.runnable(view, cat.gpus["T4"], {"NVIDIA_T4_GPUS": 1}) == 0


def test_spot_vms_in_flight_hold_the_preemptible_quota_and_spot_candidates_count_it() -> None:
    """Where the project has preemptible quota, a Spot VM not yet in the read's usage holds preemptible
    GPUs, CPUs and local SSD, and leaves the standard quota (the on-demand candidates') as it was."""
    from datetime import UTC, datetime, timedelta

    from provisioner.providers.gcp.capacity import Quota

    cat = catalogue.load()
    read = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
    quotas = {
        "CPUS": Quota(64, 0),
        "NVIDIA_T4_GPUS": Quota(1, 0),
        "LOCAL_SSD_TOTAL_GB": Quota(3000, 0),
        "PREEMPTIBLE_NVIDIA_T4_GPUS": Quota(3, 0),
        "PREEMPTIBLE_CPUS": Quota(64, 0),
        "PREEMPTIBLE_LOCAL_SSD_GB": Quota(3000, 0),
    }
    spot = GcpBurstVm(
        gpu_type="T4",
        gpu_count=1,
        cpus=8,
        local_ssds=1,
        inserted_at=read + timedelta(seconds=1),
        preemptible=True,
    )
    held = gcp_capacity.in_flight([spot], read, cat, quotas)
    assert held == {"PREEMPTIBLE_NVIDIA_T4_GPUS": 1, "PREEMPTIBLE_CPUS": 8, "PREEMPTIBLE_LOCAL_SSD_GB": 375}
    view = gcp_capacity.GcpRegionView("r", "us-central1", None, False, "gcp", "us-central1", quotas, read)
    assert gcp_capacity.runnable(view, cat.gpus["T4"], held, preemptible=True) == 2
    assert gcp_capacity.runnable(view, cat.gpus["T4"], held) == 1  # on-demand: untouched


def test_burst_vms_take_one_gpu_workers_and_spot_only_when_preemptible() -> None:
    from provisioner.domain.placement import Candidate, PlacementRequest

    def cand(spot: bool) -> Candidate:
        return Candidate(
            source=CandidateSource.GCP.value,
            id=f"gcp/r/T4/{'spot' if spot else 'on-demand'}",
            name="n1-standard-8",
            region="us-central1",
            region_account_id="acc",
            region_public_jobs=False,
            provider="gcp",
            gpu_type="T4",
            gpus_total=4,
            gpus_free=4,
            vcpus=8,
            memory_gib=0.0,
            price_per_gpu_hour=0.6,
            state=NodeState.ACTIVE.value,
            online=True,
            requirements_ok=True,
            preemptible=spot,
        )

    both = [cand(False), cand(True)]

    def offered(**req: Any) -> list[bool]:
        request = PlacementRequest(account_id="acc", gpu_types=frozenset({"T4"}), **req)
        return [c.preemptible for c in job_placement.allowed(both, request)]

    assert offered(gpu_count=1) == [False]
    assert offered(gpu_count=1, preemptible=True) == [False, True]
    assert offered(gpu_count=2, preemptible=True) == []
    assert offered(gpu_count=0, cpu_count=8) == []


def test_the_quota_cache_keeps_its_last_read_and_says_why_a_refresh_failed(
    store: sessionmaker[Session], fake_compute: Any
) -> None:
    from provisioner.store.gcp_models import GcpQuotaCache

    burst_pass(store)
    with session_scope(store) as s:
        [age] = gcp_capacity.cache_age_s(s).values()
        assert age is not None and 0 <= age < 60
    ctx, _prefix = burst_reconciler._context(store)
    assert ctx is not None
    del fake_compute.fake.region_quotas["us-central1"]  # Compute now answers 404 for the region
    burst_reconciler.refresh_quotas(store, ctx, max_age_s=0)
    with session_scope(store) as s:
        [row] = s.scalars(select(GcpQuotaCache))
        assert row.error and "reading quotas of us-central1 failed" in row.error
        assert row.quotas["NVIDIA_T4_GPUS"] == [2.0, 0.0], "the last good read stays"
        free = [c.gpus_free for c in gcp_capacity.gcp_candidates(s) if c.gpu_type == "T4"]
        assert free == [2, 2]
