"""Project bootstrap for `provision provider enable gcp`: what rigbase creates once per project.

1. a Pub/Sub topic for node events and 2. a subscription the control plane consumes (events.py);
3. a Cloud Logging sink with a unique writer identity routing our instances' log entries to that topic;
4. the topic's IAM policy granting that writer identity roles/pubsub.publisher (without it the sink
   silently drops everything);
5. the firewall rule nodes need (NFS from compute nodes to the region's storage node, nothing from outside:
   nodes only dial out).
Steps are data (one BootstrapStep per resource, in order). `apply` checks each resource and creates only
what is missing, so it is idempotent and resumes after a crash at any step; `teardown` deletes exactly these
names, in reverse order. Everything carries one name prefix and, where the resource type has them, our
labels (firewall rules and sinks have no labels in GCP: the prefix and a description mark them)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from contracts.errors import Unavailable
from provisioner.providers.base import PlannedAction
from provisioner.providers.gcp import naming, operations

if TYPE_CHECKING:  # pragma: no cover
    from provisioner.providers.gcp.clients import GcpContext

PUBLISHER_ROLE = "roles/pubsub.publisher"
NFS_PORTS = {"tcp": ["111", "2049", "20048"], "udp": ["111", "2049", "20048"]}  # rpcbind, nfsd, mountd
_NFS_PORTS_TEXT = ", ".join(f"{proto}:{'/'.join(ports)}" for proto, ports in NFS_PORTS.items())


@dataclass(frozen=True)
class Names:
    """Every name bootstrap uses, derived from project + prefix (so teardown needs nothing stored)."""

    project: str
    prefix: str = naming.DEFAULT_PREFIX

    @property
    def topic_id(self) -> str:
        return naming.gcp_name(self.prefix, "node-events")

    @property
    def topic(self) -> str:
        return f"projects/{self.project}/topics/{self.topic_id}"

    @property
    def subscription(self) -> str:
        return f"projects/{self.project}/subscriptions/{naming.gcp_name(self.prefix, 'control-plane')}"

    @property
    def sink_id(self) -> str:
        return naming.gcp_name(self.prefix, "node-events")

    @property
    def sink(self) -> str:
        return f"projects/{self.project}/sinks/{self.sink_id}"

    @property
    def firewall(self) -> str:
        return naming.gcp_name(self.prefix, "nodes-nfs")

    @property
    def sink_filter(self) -> str:
        # Audit-log entries about an instance do not carry the instance's labels, so the reliable
        # selector for Compute's own events (stop, preemption, host error) is our name prefix; entries
        # our nodes write themselves carry our managed label.
        return (
            'resource.type="gce_instance" AND ('
            f'protoPayload.resourceName:"/instances/{self.prefix}-" OR '
            f'labels."{naming.MANAGED_LABEL}"="{naming.label_value(self.prefix)}")'
        )

    def labels(self) -> dict[str, str]:
        return naming.labels(self.prefix)


# --- steps ---------------------------------------------------------------------------------------


def _found(call: Callable[[], Any]) -> bool:
    """True when the call succeeds, False when the resource is not there (get / delete probes)."""
    from google.api_core import exceptions as gexc

    try:
        call()
        return True
    except gexc.NotFound:
        return False


def _create(call: Callable[[], Any]) -> None:
    """Create, treating "already exists" as done (a concurrent or resumed bootstrap made it)."""
    from google.api_core import exceptions as gexc

    try:
        call()
    except (gexc.AlreadyExists, gexc.Conflict):
        pass


def _topic_exists(ctx: GcpContext, n: Names) -> bool:
    return _found(lambda: ctx.publisher.get_topic(request={"topic": n.topic}))


def _topic_create(ctx: GcpContext, n: Names) -> None:
    _create(lambda: ctx.publisher.create_topic(request={"name": n.topic, "labels": n.labels()}))


def _topic_delete(ctx: GcpContext, n: Names) -> bool:
    return _found(lambda: ctx.publisher.delete_topic(request={"topic": n.topic}))


def _sub_exists(ctx: GcpContext, n: Names) -> bool:
    return _found(lambda: ctx.subscriber.get_subscription(request={"subscription": n.subscription}))


def _sub_create(ctx: GcpContext, n: Names) -> None:
    _create(
        lambda: ctx.subscriber.create_subscription(
            request={
                "name": n.subscription,
                "topic": n.topic,
                "ack_deadline_seconds": 60,
                "labels": n.labels(),
            }
        )
    )


def _sub_delete(ctx: GcpContext, n: Names) -> bool:
    return _found(lambda: ctx.subscriber.delete_subscription(request={"subscription": n.subscription}))


def _get_sink(ctx: GcpContext, n: Names) -> Any | None:
    from google.api_core import exceptions as gexc

    try:
        return ctx.logging_config.get_sink(request={"sink_name": n.sink})
    except gexc.NotFound:
        return None


def _sink_create(ctx: GcpContext, n: Names) -> None:
    from google.cloud.logging_v2.types import CreateSinkRequest, LogSink

    sink = LogSink(
        name=n.sink_id,
        destination=f"pubsub.googleapis.com/{n.topic}",
        filter=n.sink_filter,
        description=f"rigbase ({n.prefix}): node events to the control plane",
    )
    # unique_writer_identity only exists on the request, hence request= (not flattened args)
    _create(
        lambda: ctx.logging_config.create_sink(
            request=CreateSinkRequest(parent=f"projects/{n.project}", sink=sink, unique_writer_identity=True)
        )
    )


def _sink_delete(ctx: GcpContext, n: Names) -> bool:
    return _found(lambda: ctx.logging_config.delete_sink(request={"sink_name": n.sink}))


def _writer_identity(ctx: GcpContext, n: Names) -> str:
    sink = _get_sink(ctx, n)
    if sink is None or not sink.writer_identity:
        raise Unavailable(f"log sink {n.sink_id} has no writer identity yet: run the bootstrap again")
    return sink.writer_identity


def _iam_exists(ctx: GcpContext, n: Names) -> bool:
    if _get_sink(ctx, n) is None:
        return False
    member = _writer_identity(ctx, n)
    policy = ctx.topic_iam.get_iam_policy(request={"resource": n.topic})
    return any(b.role == PUBLISHER_ROLE and member in b.members for b in policy.bindings)


def _iam_create(ctx: GcpContext, n: Names) -> None:
    """Read-modify-write with the policy's etag, so a concurrent change is not overwritten."""
    member = _writer_identity(ctx, n)
    policy = ctx.topic_iam.get_iam_policy(request={"resource": n.topic})
    for binding in policy.bindings:
        if binding.role == PUBLISHER_ROLE:
            if member not in binding.members:
                binding.members.append(member)
            break
    else:
        policy.bindings.add(role=PUBLISHER_ROLE, members=[member])
    ctx.topic_iam.set_iam_policy(request={"resource": n.topic, "policy": policy})


def _firewall_exists(ctx: GcpContext, n: Names) -> bool:
    return _found(lambda: ctx.firewalls.get(project=n.project, firewall=n.firewall))


def _firewall_create(ctx: GcpContext, n: Names) -> None:
    from google.api_core import exceptions as gexc
    from google.cloud import compute_v1

    tag = naming.network_tag(n.prefix)
    rule = compute_v1.Firewall(
        name=n.firewall,
        description=(
            f"rigbase ({n.prefix}): NFS from compute nodes to the region's storage node; managed by rigbase"
        ),
        network="global/networks/default",
        direction="INGRESS",
        priority=1000,
        source_tags=[tag],
        target_tags=[tag],
        allowed=[compute_v1.Allowed(I_p_protocol=proto, ports=ports) for proto, ports in NFS_PORTS.items()],
    )
    try:
        op = ctx.firewalls.insert_unary(
            request=compute_v1.InsertFirewallRequest(
                project=n.project,
                firewall_resource=rule,
                request_id=naming.request_id(n.project, "firewall", n.firewall),
            )
        )
    except gexc.Conflict:
        return
    op = operations.wait(ctx, op.name)
    err = operations.error_of(op)
    if err:
        raise Unavailable(f"creating firewall rule {n.firewall} failed: {err[0]} {err[1]}")


def _firewall_delete(ctx: GcpContext, n: Names) -> bool:
    from google.api_core import exceptions as gexc

    try:
        op = ctx.firewalls.delete_unary(project=n.project, firewall=n.firewall)
    except gexc.NotFound:
        return False
    operations.wait(ctx, op.name)
    return True


@dataclass(frozen=True)
class BootstrapStep:
    kind: str
    name: Callable[[Names], str]
    detail: Callable[[Names], str]
    exists: Callable[[GcpContext, Names], bool]
    create: Callable[[GcpContext, Names], None]
    delete: Callable[[GcpContext, Names], bool] | None  # None: goes away with another resource


STEPS: tuple[BootstrapStep, ...] = (
    BootstrapStep(
        "pubsub-topic",
        lambda n: n.topic,
        lambda n: "node events from Cloud Logging",
        _topic_exists,
        _topic_create,
        _topic_delete,
    ),
    BootstrapStep(
        "pubsub-subscription",
        lambda n: n.subscription,
        lambda n: f"control plane's streaming pull on {n.topic_id}",
        _sub_exists,
        _sub_create,
        _sub_delete,
    ),
    BootstrapStep(
        "logging-sink",
        lambda n: n.sink,
        lambda n: f"unique writer identity; filter: {n.sink_filter}",
        lambda c, n: _get_sink(c, n) is not None,
        _sink_create,
        _sink_delete,
    ),
    BootstrapStep(
        "pubsub-topic-iam",
        lambda n: n.topic,
        lambda n: f"grant {PUBLISHER_ROLE} to the sink's writer identity",
        _iam_exists,
        _iam_create,
        None,
    ),
    BootstrapStep(
        "firewall",
        lambda n: n.firewall,
        lambda n: f"allow NFS ({_NFS_PORTS_TEXT}) between {naming.network_tag(n.prefix)} instances",
        _firewall_exists,
        _firewall_create,
        _firewall_delete,
    ),
)


def plan(names: Names, ctx: GcpContext | None = None) -> list[PlannedAction]:
    """What bootstrap would create. Without a context (dry run before any API call): everything; with
    one: only what is missing now."""
    return [
        PlannedAction("create", s.kind, s.name(names), s.detail(names))
        for s in STEPS
        if ctx is None or not s.exists(ctx, names)
    ]


def apply(
    ctx: GcpContext, names: Names, on_progress: Callable[[str], None] | None = None
) -> list[PlannedAction]:
    """Create what is missing, in order; returns what was created (empty when already complete)."""
    say = on_progress or (lambda _m: None)
    done: list[PlannedAction] = []
    for s in STEPS:
        if s.exists(ctx, names):
            say(f"{s.kind} {s.name(names)}: present")
            continue
        say(f"{s.kind} {s.name(names)}: creating")
        s.create(ctx, names)
        done.append(PlannedAction("create", s.kind, s.name(names), s.detail(names)))
    return done


def teardown(
    ctx: GcpContext, names: Names, on_progress: Callable[[str], None] | None = None
) -> list[PlannedAction]:
    """Delete exactly what bootstrap makes (by name), newest first; absent resources are skipped."""
    say = on_progress or (lambda _m: None)
    removed: list[PlannedAction] = []
    for s in reversed(STEPS):
        if s.delete is None:
            continue
        if s.delete(ctx, names):
            say(f"{s.kind} {s.name(names)}: deleted")
            removed.append(PlannedAction("delete", s.kind, s.name(names)))
    return removed
