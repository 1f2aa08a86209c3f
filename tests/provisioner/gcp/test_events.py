"""Instance log events through the real Pub/Sub emulator into node-state callbacks."""

from __future__ import annotations

import json
import queue
from typing import Any

import pytest

from provisioner.providers.gcp import bootstrap, events
from provisioner.providers.gcp.events import EventConsumer, NodeEventKind
from tests.fixtures.gcp import PROJECT


def log_entry(method: str, instance: str, zone: str = "us-central1-a", **extra: Any) -> bytes:
    """A LogEntry as a Cloud Logging sink publishes it to Pub/Sub (JSON)."""
    entry = {
        "insertId": "abc",
        "logName": f"projects/{PROJECT}/logs/cloudaudit.googleapis.com%2Fsystem_event",
        "resource": {
            "type": "gce_instance",
            "labels": {"instance_id": "123", "zone": zone, "project_id": PROJECT},
        },
        "protoPayload": {
            "@type": "type.googleapis.com/google.cloud.audit.AuditLog",
            "methodName": method,
            "resourceName": f"projects/{PROJECT}/zones/{zone}/instances/{instance}",
            "serviceName": "compute.googleapis.com",
        },
        "timestamp": "2026-11-21T12:00:00Z",
        "severity": "NOTICE",
    }
    entry.update(extra)
    return json.dumps(entry).encode()


@pytest.mark.parametrize(
    ("method", "kind", "reason"),
    [
        ("compute.instances.preempted", NodeEventKind.OFFLINE, "preempted"),
        ("v1.compute.instances.stop", NodeEventKind.OFFLINE, "stopped"),
        ("compute.instances.hostError", NodeEventKind.OFFLINE, "host error"),
        ("v1.compute.instances.start", NodeEventKind.STARTED, "started"),
        ("v1.compute.instances.delete", NodeEventKind.DELETED, "deleted"),
    ],
)
def test_parse_table(method: str, kind: NodeEventKind, reason: str) -> None:
    ev = events.parse(log_entry(method, "rigbase-storage-lab"))
    assert ev is not None and (ev.kind, ev.reason, ev.instance, ev.zone) == (
        kind,
        reason,
        "rigbase-storage-lab",
        "us-central1-a",
    )


@pytest.mark.parametrize(
    "data",
    [
        log_entry("v1.compute.instances.stop", "someone-elses-vm"),
        log_entry("v1.compute.instances.setLabels", "rigbase-storage-lab"),
        log_entry("v1.compute.instances.stop", "rigbase-storage-lab", operation={"id": "op", "first": True}),
        b"not json",
        b"[]",
    ],
)
def test_parse_ignores(data: bytes) -> None:
    assert events.parse(data) is None


def test_streaming_pull_turns_preemption_into_offline(
    gcp_ctx: Any, iam_server: Any, logging_server: Any
) -> None:
    names = bootstrap.Names(project=PROJECT, prefix="evt")
    bootstrap.apply(gcp_ctx, names)
    got: queue.Queue = queue.Queue()
    failures = {"n": 0}

    def on_event(ev: Any) -> None:
        if ev.reason == "stopped" and failures["n"] == 0:  # the first delivery fails: it must come again
            failures["n"] += 1
            raise RuntimeError("database busy")
        got.put(ev)

    with EventConsumer(gcp_ctx, names.subscription, on_event, prefix="evt"):
        pub = gcp_ctx.publisher
        pub.publish(names.topic, log_entry("v1.compute.instances.setLabels", "evt-storage-lab")).result(
            timeout=10
        )
        pub.publish(names.topic, log_entry("v1.compute.instances.stop", "other-vm")).result(timeout=10)
        pub.publish(names.topic, log_entry("compute.instances.preempted", "evt-storage-lab")).result(
            timeout=10
        )
        pub.publish(names.topic, log_entry("v1.compute.instances.stop", "evt-storage-lab2")).result(
            timeout=10
        )
        received = [got.get(timeout=30), got.get(timeout=30)]
    by_instance = {e.instance: e for e in received}
    assert (
        by_instance["evt-storage-lab"].kind is NodeEventKind.OFFLINE
        and by_instance["evt-storage-lab"].reason == "preempted"
    )
    assert by_instance["evt-storage-lab2"].reason == "stopped"  # redelivered after the nack
    assert failures["n"] == 1
    assert got.empty()
    bootstrap.teardown(gcp_ctx, names)
