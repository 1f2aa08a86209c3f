"""Project bootstrap against Google's Pub/Sub emulator, the IAM and Logging gRPC servers and the Compute
fake: plan, apply, idempotence, resume after a crash, teardown of exactly what we made."""

from __future__ import annotations

from typing import Any

import pytest

from provisioner.providers.gcp import bootstrap
from provisioner.providers.gcp.bootstrap import PUBLISHER_ROLE, Names
from tests.fixtures.gcp import PROJECT

KINDS = ["pubsub-topic", "pubsub-subscription", "logging-sink", "pubsub-topic-iam", "firewall"]


@pytest.fixture()
def names(request: pytest.FixtureRequest) -> Names:
    # one prefix per test: the emulator lives for the whole session
    return Names(project=PROJECT, prefix=f"rb{abs(hash(request.node.name)) % 10**6}")


def test_dry_run_plan_lists_everything_without_calls() -> None:
    actions = bootstrap.plan(Names(project="p"))
    assert [a.kind for a in actions] == KINDS
    assert all(a.verb == "create" for a in actions)
    assert all(a.name.split("/")[-1].startswith("rigbase-") for a in actions)


def test_apply_creates_everything(
    gcp_ctx: Any, names: Names, iam_server: Any, logging_server: Any, fake_compute: Any
) -> None:
    assert [a.kind for a in bootstrap.plan(names, gcp_ctx)] == KINDS
    created = bootstrap.apply(gcp_ctx, names)
    assert [a.kind for a in created] == KINDS

    topic = gcp_ctx.publisher.get_topic(request={"topic": names.topic})
    assert topic.labels["rigbase-managed"] == names.prefix
    sub = gcp_ctx.subscriber.get_subscription(request={"subscription": names.subscription})
    assert sub.topic == names.topic
    sink = logging_server.sinks[names.sink]
    assert sink.destination == f"pubsub.googleapis.com/{names.topic}"
    assert f'"/instances/{names.prefix}-"' in sink.filter and '"rigbase-managed"' in sink.filter
    assert sink.writer_identity.startswith("serviceAccount:service-")  # unique writer identity
    assert iam_server.members(names.topic, PUBLISHER_ROLE) == [sink.writer_identity]
    fw = fake_compute.fake.firewalls[names.firewall]
    assert fw["sourceTags"] == fw["targetTags"] == [f"{names.prefix}-node"]
    assert {a["IPProtocol"] for a in fw["allowed"]} == {"tcp", "udp"}


def test_apply_is_idempotent(gcp_ctx: Any, names: Names, iam_server: Any, logging_server: Any) -> None:
    bootstrap.apply(gcp_ctx, names)
    assert bootstrap.apply(gcp_ctx, names) == []
    assert bootstrap.plan(names, gcp_ctx) == []
    assert logging_server.calls["CreateSink"] == 1 and iam_server.calls["SetIamPolicy"] == 1


def test_resume_after_crash_midway(
    gcp_ctx: Any, names: Names, iam_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Crash after the sink was made but before the topic IAM grant: the rerun does only the rest."""
    steps = list(bootstrap.STEPS)

    def crash(ctx: Any, n: Names) -> None:
        raise RuntimeError("control plane killed")

    monkeypatch.setattr(
        bootstrap,
        "STEPS",
        tuple(
            s if s.kind != "pubsub-topic-iam" else s.__class__(**{**s.__dict__, "create": crash})
            for s in steps
        ),
    )
    with pytest.raises(RuntimeError):
        bootstrap.apply(gcp_ctx, names)
    monkeypatch.setattr(bootstrap, "STEPS", tuple(steps))
    assert [a.kind for a in bootstrap.plan(names, gcp_ctx)] == ["pubsub-topic-iam", "firewall"]
    assert [a.kind for a in bootstrap.apply(gcp_ctx, names)] == ["pubsub-topic-iam", "firewall"]
    assert len(iam_server.members(names.topic, PUBLISHER_ROLE)) == 1


def test_iam_grant_keeps_existing_bindings(gcp_ctx: Any, names: Names, iam_server: Any) -> None:
    bootstrap.apply(gcp_ctx, names)
    policy = gcp_ctx.topic_iam.get_iam_policy(request={"resource": names.topic})
    policy.bindings.add(role="roles/pubsub.viewer", members=["user:ops@example.com"])
    gcp_ctx.topic_iam.set_iam_policy(request={"resource": names.topic, "policy": policy})
    iam_server.policies[names.topic].ClearField("bindings")  # someone removed our grant by hand
    iam_server.policies[names.topic].bindings.add(
        role="roles/pubsub.viewer", members=["user:ops@example.com"]
    )
    assert [a.kind for a in bootstrap.apply(gcp_ctx, names)] == ["pubsub-topic-iam"]
    roles = {b.role for b in iam_server.policies[names.topic].bindings}
    assert roles == {"roles/pubsub.viewer", PUBLISHER_ROLE}


def test_teardown_removes_exactly_what_we_made(
    gcp_ctx: Any, names: Names, logging_server: Any, fake_compute: Any
) -> None:
    foreign_topic = f"projects/{PROJECT}/topics/not-ours-{names.prefix}"
    gcp_ctx.publisher.create_topic(request={"name": foreign_topic})
    fake_compute.fake.firewalls["default-allow-ssh"] = {"name": "default-allow-ssh"}
    bootstrap.apply(gcp_ctx, names)
    removed = bootstrap.teardown(gcp_ctx, names)
    assert [a.kind for a in removed] == ["firewall", "logging-sink", "pubsub-subscription", "pubsub-topic"]
    assert names.sink not in logging_server.sinks
    assert list(fake_compute.fake.firewalls) == ["default-allow-ssh"]
    assert gcp_ctx.publisher.get_topic(request={"topic": foreign_topic}).name == foreign_topic
    assert [a.kind for a in bootstrap.plan(names, gcp_ctx)] == KINDS
    assert bootstrap.teardown(gcp_ctx, names) == []  # idempotent
