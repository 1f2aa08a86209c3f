"""The GCP provider wired into the control plane: the real `provision` CLI against a real `provision serve`
(reconciler loop and Pub/Sub consumer running in it) whose Google clients point at the Compute fake, the
Pub/Sub emulator and the IAM/Logging gRPC servers through a GCP driver injected into the
server (tests/fixtures/serve_app.py).
Everything here runs inside `unshare -n` (see conftest.py): loopback only."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select, text

from provisioner.providers.gcp import bootstrap
from provisioner.store.engine import make_engine, make_sessionmaker, session_scope
from provisioner.store.gcp_models import GcpStorageNode
from provisioner.store.models import Node
from provisioner.store.schema import metadata
from tests.fixtures.control_plane import ControlPlane, start_control_plane
from tests.fixtures.gcp import PROJECT, make_sa_key
from tests.fixtures.manifests import Builder, gce_build
from tests.fixtures.postgres import snapshot_of
from tests.provisioner.gcp.published import publish_image
from tests.provisioner.gcp.test_events import log_entry


def ok(cp: ControlPlane, *args: str, input: str | None = None) -> Any:
    r = cp.provision(*args, input=input)
    assert r.returncode == 0, (args, r.returncode, r.stdout, r.stderr)
    return r


def refused(cp: ControlPlane, *args: str, exit_code: int = 1, input: str | None = None) -> str:
    r = cp.provision(*args, input=input)
    assert r.returncode == exit_code, (args, r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    return lines[0]


def until(what: str, check: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def show(cp: ControlPlane, what: str, name: str) -> dict[str, Any]:
    """Through the API (polling with the CLI would spend the suite's time starting Python)."""
    with cp.client() as client:
        return client.get(f"/v1/{what}s/{name}").json()


def show_gcp(cp: ControlPlane, region: str = "us-central1") -> dict[str, Any]:
    with cp.client() as client:
        return client.get(f"/v1/gcp/regions/{region}").json()


def dump_store(database_url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table: to prove a refusal changed nothing."""
    engine = make_engine(database_url)
    try:
        return snapshot_of(engine)
    finally:
        engine.dispose()


def enable(cp: ControlPlane, key_file: Path, prefix: str) -> str:
    provider_id = ok(
        cp, "provider", "enable", "gcp", "--credentials", str(key_file), "--prefix", prefix
    ).stdout.strip()
    until("provider enabled", lambda: show(cp, "provider", "gcp")["state"] == "enabled")
    return provider_id


def publish(
    cp: ControlPlane, tmp_path: Path, gce_archive: Path, region: str = "us-central1", **manifest_fields: Any
) -> str:
    """What the operator does after `region create`: trust the builder's key and publish the GCE build made
    with the region's bundle (a stand-in build: tests/fixtures/manifests.py); returns the publication id."""
    builder = Builder(tmp_path / "image-builder")
    ok(cp, "image", "trust-key", str(builder.public_path))
    manifest = gce_build(builder, tmp_path / "build", region, gce_archive, **manifest_fields)
    return ok(cp, "image", "publish", str(manifest), "--provider", "gcp", "--wait").stdout.strip()


def test_operator_walkthrough(  # noqa: PLR0915
    gcp_world: dict[str, Any], key_file: Path, tmp_path: Path, gcp_ctx: Any, gce_archive: Path
) -> None:
    fake, prefix = gcp_world["compute"], gcp_world["prefix"]
    names = bootstrap.Names(project=PROJECT, prefix=prefix)
    key_text = key_file.read_text()
    with start_control_plane(tmp_path / "home", fakes=gcp_world["fakes"]) as cp:
        before = dump_store(cp.database_url)
        # bad input: one line naming the field, exit 2, nothing stored
        wrong = tmp_path / "wrong.json"
        wrong.write_text(json.dumps(make_sa_key(type="authorized_user")))
        assert "'type' is 'authorized_user'" in refused(
            cp, "provider", "enable", "gcp", "--credentials", str(wrong), exit_code=2
        )
        assert "'private_key'" in refused(
            cp,
            "provider",
            "enable",
            "gcp",
            "--credentials",
            "-",
            exit_code=2,
            input=json.dumps(
                make_sa_key(private_key="-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
            ),
        )
        assert "'file' is not JSON" in refused(
            cp, "provider", "enable", "gcp", "--credentials", "-", exit_code=2, input="{oops"
        )
        assert "cannot read credentials file" in refused(
            cp, "provider", "enable", "gcp", "--credentials", str(tmp_path / "nope.json"), exit_code=2
        )
        # missing roles are named as docs/product-rules.md names them; nothing stored either
        from provisioner.providers.gcp.permissions import ROLE_PERMISSIONS

        fake.granted_permissions = set(ROLE_PERMISSIONS["Compute Admin"]) | set(
            ROLE_PERMISSIONS["Service Account User"]
        )
        line = refused(cp, "provider", "enable", "gcp", "--credentials", str(key_file))
        assert "lacks Pub/Sub Admin, Logs Configuration Writer" in line
        fake.granted_permissions = {p for perms in ROLE_PERMISSIONS.values() for p in perms}
        # dry run: project and account shown, plan listed, nothing stored or created
        r = ok(
            cp,
            "provider",
            "enable",
            "gcp",
            "--credentials",
            "-",
            "--prefix",
            prefix,
            "--dry-run",
            input=key_text,
        )
        assert f"project: {PROJECT}" in r.stderr and "service account: rigbase@" in r.stderr
        assert "holds every permission" in r.stderr
        for kind in ("pubsub-topic", "pubsub-subscription", "logging-sink", "pubsub-topic-iam", "firewall"):
            assert kind in r.stdout
        assert dump_store(cp.database_url) == before
        assert not fake.firewalls and not gcp_world["logging"].sinks

        r = ok(cp, "provider", "enable", "gcp", "--credentials", str(key_file), "--prefix", prefix, "--wait")
        provider_id = r.stdout.strip()
        assert provider_id.startswith("prv_") and "enabled: bootstrap complete (5 created)" in r.stderr
        assert names.firewall in fake.firewalls and names.sink in gcp_world["logging"].sinks
        shown = ok(cp, "provider", "show", "gcp", "--json").stdout
        assert json.loads(shown)["state"] == "enabled"
        assert json.loads(shown)["config"] == {
            "project_id": PROJECT,
            "client_email": f"rigbase@{PROJECT}.iam.gserviceaccount.com",
            "prefix": prefix,
        }
        # the key is sealed at rest and never logged or returned
        pem_line = json.loads(key_text)["private_key"].splitlines()[1]
        engine = make_engine(cp.database_url)
        with engine.connect() as conn:
            sealed = conn.execute(text("SELECT sealed_config FROM providers")).scalar_one()
            raw_db = "\n".join(str(row) for t in metadata.sorted_tables for row in conn.execute(t.select()))
        assert pem_line not in raw_db and pem_line not in shown and sealed.startswith("gAAAA")
        assert pem_line not in (cp.home / "server.log").read_text()

        # quota, online through the server
        q = json.loads(ok(cp, "region", "quota", "us-central1", "--json").stdout)
        v100 = next(g for g in q["gpus"] if g["gpu"] == "V100")
        assert (v100["runnable_jobs"], v100["limited_by"]) == (7, "gpus")
        # refusals: outside the catalogue; no capacity anywhere (saying why); unknown class
        assert "not in rigbase's catalogue" in refused(
            cp,
            "region",
            "create",
            "mars-north1",
            "--provider",
            "gcp",
            "--storage-class",
            "small",
            exit_code=2,
        )
        line = refused(cp, "region", "create", "us-east1", "--provider", "gcp", "--storage-class", "small")
        assert "no capacity for any GPU type" in line and "V100: cpus" in line
        assert "unknown storage class" in refused(
            cp, "region", "create", "us-central1", "--provider", "gcp", "--storage-class", "huge", exit_code=2
        )
        assert "--storage-class" in refused(
            cp, "region", "create", "us-central1", "--provider", "gcp", exit_code=2
        )
        # dry run: quota table and plan, nothing created
        before = dump_store(cp.database_url)
        r = ok(
            cp,
            "region",
            "create",
            "us-central1",
            "--provider",
            "gcp",
            "--storage-class",
            "small",
            "--dry-run",
        )
        assert (
            "V100" in r.stdout and "RUNNABLE JOBS" in r.stdout and f"{prefix}-storage-us-central1" in r.stdout
        )
        assert dump_store(cp.database_url) == before and fake.instance_count() == 0

        # create: quota table on stderr, the id alone on stdout; nothing to wait for until the
        # region's image is published (it is built with the region's bundle)
        fake.zone_errors["us-central1-a"] = "ZONE_RESOURCE_POOL_EXHAUSTED"
        fake.instances[("us-central1-b", "someone-elses-vm")] = {"name": "someone-elses-vm", "labels": {}}
        r = ok(cp, "region", "create", "us-central1", "--provider", "gcp", "--storage-class", "small")
        region_id = r.stdout.strip()
        assert region_id.startswith("reg_") and "\n" not in region_id
        assert "RUNNABLE JOBS" in r.stderr
        assert "waiting for a published rigbase image for region us-central1" in r.stderr
        assert "provision image publish DIR/manifest.json --provider gcp" in r.stderr
        assert fake.instance_count() == 1  # someone else's only
        # the operator publishes the image; the storage node's VM boots it
        pub_id = publish(cp, tmp_path, gce_archive)
        assert pub_id.startswith("pub_")
        (image,) = fake.images.values()
        assert image["status"] == "READY" and image["family"] == f"{prefix}-us-central1"
        assert image["guestOsFeatures"] == [{"type": "UEFI_COMPATIBLE"}]
        assert image["rawDisk"]["source"].startswith(
            f"https://storage.googleapis.com/{prefix}-images-{PROJECT}/"
        )
        until("storage node VM ready", lambda: show_gcp(cp)["vm"]["status"] == "ready")
        inst_name = f"{prefix}-storage-us-central1"
        inst = fake.instances[("us-central1-b", inst_name)]
        assert inst["shieldedInstanceConfig"]["enableVtpm"] is True
        boot = next(d for d in inst["disks"] if d.get("boot"))
        assert boot["initializeParams"]["sourceImage"] == (
            f"projects/{PROJECT}/global/images/family/{prefix}-us-central1"
        )
        bundle = json.loads({i["key"]: i["value"] for i in inst["metadata"]["items"]}["rigbase-bundle"])
        assert (bundle["region"], bundle["region_id"], bundle["provider"]) == (
            "us-central1",
            region_id,
            "gcp",
        )
        assert bundle["join_token"].startswith("rbj_") and bundle["control_plane_url"] == cp.url
        # the node: storage service, EK pinned, minion_id derived from that EK
        node = show(cp, "node", inst_name)
        assert (node["service"], node["state"], node["region"]) == ("storage", "new", "us-central1")
        sessions = make_sessionmaker(engine)
        with session_scope(sessions) as s:
            row = s.scalar(select(Node).where(Node.name == inst_name))
            assert row.pinned_ek_public is not None
            assert row.minion_id == hashlib.sha256(row.pinned_ek_public).hexdigest()[:32] == node["minion_id"]
            from cryptography.hazmat.primitives import serialization

            ek = serialization.load_pem_public_key(fake.ek_pems[("us-central1-b", inst_name)].encode())
            assert row.pinned_ek_public == ek.public_bytes(
                serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
            )

        # the join protocol activates the node (storage nodes become active by themselves) and its minion
        # heartbeats (both stand-ins here: no VM boots) → region healthy
        from provisioner.domain.states import NodeState
        from provisioner.services.fleet import nodes as node_service

        with session_scope(sessions) as s:
            row = s.scalar(select(Node).where(Node.name == inst_name))
            for to in (NodeState.ENROLLING, NodeState.PROVISIONING, NodeState.MAINTENANCE, NodeState.ACTIVE):
                node_service.transition(s, row, to, actor="test:join")
        with session_scope(sessions) as s:
            node_service.record_report(s, s.scalar(select(Node).where(Node.name == inst_name)))
        until("region healthy", lambda: show(cp, "region", "us-central1")["state"] == "healthy")

        # a preemption seen through Cloud Logging → sink → Pub/Sub → the server's streaming pull
        pub = gcp_ctx.publisher
        pub.publish(names.topic, log_entry("compute.instances.preempted", inst_name, "us-central1-b")).result(
            timeout=10
        )
        region = until(
            "region offline", lambda: (r := show(cp, "region", "us-central1"))["state"] == "offline" and r
        )
        assert f"storage node {inst_name} preempted" in region["reason"]
        pub.publish(names.topic, log_entry("v1.compute.instances.start", inst_name, "us-central1-b")).result(
            timeout=10
        )
        until("region healthy again", lambda: show(cp, "region", "us-central1")["state"] == "healthy")

        # provider removal is refused while the region lives; region remove deletes our VM, nothing else
        assert "still has regions" in refused(cp, "provider", "remove", "gcp", "--yes")
        ok(cp, "region", "remove", "us-central1", "--yes")
        until("region removed", lambda: show(cp, "region", "us-central1").get("code") == "region_not_found")
        assert list(fake.instances) == [("us-central1-b", "someone-elses-vm")]
        with session_scope(sessions) as s:
            assert s.scalar(select(Node.state).where(Node.name == inst_name)) == "removed"
            assert s.get(GcpStorageNode, region_id).status == "deleted"

        # provider removal tears down exactly what bootstrap made
        foreign = f"projects/{PROJECT}/topics/not-ours-{prefix}"
        gcp_ctx.publisher.create_topic(request={"name": foreign})
        fake.firewalls["default-allow-ssh"] = {"name": "default-allow-ssh"}
        ok(cp, "provider", "remove", "gcp", "--yes")
        until("provider removed", lambda: show(cp, "provider", "gcp").get("state") is None)
        assert "gcp" not in ok(cp, "provider", "list").stdout
        assert list(fake.firewalls) == ["default-allow-ssh"] and names.sink not in gcp_world["logging"].sinks
        assert gcp_ctx.publisher.get_topic(request={"topic": foreign}).name == foreign
        assert bootstrap.plan(names, gcp_ctx)[0].kind == "pubsub-topic"  # ours is gone
        engine.dispose()


def test_quota_from_json_works_offline_without_a_server(saved_region: Path, tmp_path: Path) -> None:
    # RIGBASE_URL points at a closed port: a command that tried to reach a server would fail
    cp = ControlPlane(
        url="http://127.0.0.1:9", token="", home=tmp_path / "nohome", database_url="", process=None
    )  # type: ignore[arg-type]
    r = cp.provision("region", "quota", "us-central1", "--from-json", str(saved_region), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    by_gpu = {g["gpu"]: g for g in doc["gpus"]}
    assert doc["region"] == "us-central1"
    assert (by_gpu["V100"]["runnable_jobs"], by_gpu["V100"]["limited_by"]) == (7, "gpus")
    assert (by_gpu["A100"]["runnable_jobs"], by_gpu["A100"]["cpu_metric"], by_gpu["A100"]["limited_by"]) == (
        2,
        "A2_CPUS",
        "cpus",
    )
    r = cp.provision("region", "quota", "us-east1", "--from-json", str(saved_region))
    assert r.returncode == 2 and "describes us-central1, not us-east1" in r.stderr


@pytest.fixture()
def crash_world(gcp_world: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield gcp_world
    gcp_world["compute"].on_call = None


def test_killed_at_every_step_still_makes_exactly_one_instance(
    crash_world: dict[str, Any], key_file: Path, tmp_path: Path
) -> None:
    """SIGKILL the real `provision serve` the moment Compute has handled each step of the storage node's
    creation (the answer never reaches it): the first lookup, the insert, the operation wait, the EK read.
    Each restart resumes from the store; the requestId makes the retried insert Compute's original
    operation. At the end: one instance, one insert operation, the EK pinned."""
    fake, prefix = crash_world["compute"], crash_world["prefix"]
    home = tmp_path / "home"
    with start_control_plane(home, fakes=crash_world["fakes"]) as cp:
        enable(cp, key_file, prefix)
        fake.op_duration_s = 600.0  # runs until released below: the retried insert finds it still running
        armed = ["instance_get", "instance_insert", "op_wait", "shielded_identity"]
        killed: list[str] = []

        def kill_at(route: str) -> None:
            if route in armed:
                armed.remove(route)
                killed.append(route)
                os.kill(current["pid"], signal.SIGKILL)
                if route == "op_wait":  # the operation completes while the control plane is down
                    for op in fake._ops.values():
                        op.duration = 0.0

        current = {"pid": cp.process.pid}
        fake.on_call = kill_at
        ok(cp, "region", "create", "us-central1", "--provider", "gcp", "--storage-class", "small")
        # the image recorded published in the server's store (the publishing itself is the walkthrough's):
        # the reconciler's next pass starts the VM
        engine = make_engine(cp.database_url)
        publish_image(make_sessionmaker(engine), "us-central1", tmp_path / "image-builder")
        engine.dispose()
        until("first kill", lambda: cp.process.poll() is not None)
    restarts = 0
    while True:
        with start_control_plane(home, fakes=crash_world["fakes"]) as cp:
            current["pid"] = cp.process.pid
            restarts += 1

            def finished_or_killed() -> Any:
                if cp.process.poll() is not None:
                    return "killed"
                try:
                    with cp.client() as client:
                        vm = client.get("/v1/gcp/regions/us-central1").json().get("vm") or {}
                except httpx.TransportError:
                    return None  # killed while answering: the next look sees it
                return "ready" if vm.get("status") == "ready" else None

            outcome = until("a kill or the storage node ready", finished_or_killed, timeout=40)
            if outcome == "ready":
                break
        assert restarts < 8, killed
    assert killed == ["instance_get", "instance_insert", "op_wait", "shielded_identity"]
    assert fake.instance_count() == 1
    assert sum(1 for op in fake._ops.values() if op.op_type == "insert" and "/instances/" in op.target) == 1
    engine = make_engine(cp.database_url)
    with session_scope(make_sessionmaker(engine)) as s:
        node = s.scalar(select(Node).where(Node.name == f"{prefix}-storage-us-central1"))
        assert node.pinned_ek_public is not None and node.state == "new"
    engine.dispose()
