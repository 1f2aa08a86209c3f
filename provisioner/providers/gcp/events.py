"""Node events from Google Cloud: Cloud Logging → our sink → Pub/Sub topic → this consumer.

The control plane streams the bootstrap subscription (streaming pull) and turns Compute's audit/system
log entries about our instances into node-state callbacks. The mapping is a table: a stopped, preempted,
host-failed or guest-terminated storage node goes offline; a started one is back (online itself comes
from heartbeats); a deleted one is gone. Entries we do not recognise are acknowledged and ignored, so a
noisy log never blocks the subscription."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from provisioner.providers.base import NodeEvent, NodeEventKind
from provisioner.providers.gcp import naming

__all__ = ["EventConsumer", "NodeEvent", "NodeEventKind", "METHOD_EVENTS", "parse"]

if TYPE_CHECKING:  # pragma: no cover
    from provisioner.providers.gcp.clients import GcpContext

log = logging.getLogger(__name__)


# Compute's methodName (audit activity / system-event logs) -> (event, reason)
METHOD_EVENTS: dict[str, tuple[NodeEventKind, str]] = {
    "v1.compute.instances.stop": (NodeEventKind.OFFLINE, "stopped"),
    "beta.compute.instances.stop": (NodeEventKind.OFFLINE, "stopped"),
    "v1.compute.instances.suspend": (NodeEventKind.OFFLINE, "suspended"),
    "compute.instances.preempted": (NodeEventKind.OFFLINE, "preempted"),
    "compute.instances.hostError": (NodeEventKind.OFFLINE, "host error"),
    "compute.instances.guestTerminate": (NodeEventKind.OFFLINE, "guest shut down"),
    "v1.compute.instances.start": (NodeEventKind.STARTED, "started"),
    "v1.compute.instances.resume": (NodeEventKind.STARTED, "resumed"),
    "compute.instances.automaticRestart": (NodeEventKind.STARTED, "automatic restart"),
    "v1.compute.instances.delete": (NodeEventKind.DELETED, "deleted"),
}


def parse(data: bytes, prefix: str = naming.DEFAULT_PREFIX) -> NodeEvent | None:
    """A Pub/Sub message body (a LogEntry as JSON, as a sink writes it) → a NodeEvent, or None."""
    try:
        entry = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(entry, dict):
        return None
    payload = entry.get("protoPayload") or {}
    method = payload.get("methodName", "")
    mapped = METHOD_EVENTS.get(method)
    if mapped is None:
        return None
    op = entry.get("operation") or {}
    if op.get("first") and not op.get("last"):
        return None  # long operations log twice; act once, when they finish
    resource_name = payload.get("resourceName", "")  # projects/P/zones/Z/instances/NAME
    parts = resource_name.split("/")
    if len(parts) < 6 or parts[-2] != "instances":
        return None
    instance, zone = parts[-1], parts[-3]
    if not instance.startswith(f"{prefix}-"):
        return None  # not ours (the sink filter should already have dropped it)
    kind, reason = mapped
    return NodeEvent(
        kind=kind,
        reason=reason,
        instance=instance,
        zone=zone,
        method=method,
        timestamp=entry.get("timestamp", ""),
    )


class EventConsumer:
    """Streaming pull on the control plane's subscription; calls `on_event` for each NodeEvent.

    A message is acked after on_event returns; if on_event raises, it is nacked and Pub/Sub redelivers it,
    so a database hiccup does not lose a node going offline."""

    def __init__(
        self,
        ctx: GcpContext,
        subscription: str,
        on_event: Callable[[NodeEvent], None],
        prefix: str = naming.DEFAULT_PREFIX,
    ) -> None:
        self._ctx = ctx
        self._subscription = subscription
        self._on_event = on_event
        self._prefix = prefix
        self._future: Any = None

    def _callback(self, message: Any) -> None:
        event = parse(message.data, self._prefix)
        if event is None:
            message.ack()
            return
        try:
            self._on_event(event)
        except Exception:
            log.exception(
                "node event %s for %s failed; it will be redelivered", event.kind.value, event.instance
            )
            message.nack()
            return
        message.ack()

    def start(self) -> None:
        from google.cloud.pubsub_v1.types import FlowControl

        self._future = self._ctx.subscriber.subscribe(
            self._subscription, callback=self._callback, flow_control=FlowControl(max_messages=100)
        )

    @property
    def running(self) -> bool:
        """False once the stream ended (cancelled, or the subscription vanished): the supervisor restarts
        it."""
        return self._future is not None and not self._future.done()

    def stop(self, timeout: float = 5.0) -> None:
        if self._future is not None:
            self._future.cancel()
            try:
                self._future.result(timeout=timeout)
            except Exception:  # cancelled futures raise CancelledError; nothing to report on shutdown
                pass
            self._future = None

    def __enter__(self) -> EventConsumer:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
