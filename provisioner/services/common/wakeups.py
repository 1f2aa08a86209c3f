"""Waking a reconciler once a change is committed: the one way services ask for slow work now.

Services record intent in the store and the reconcilers (provisioner/reconcilers/) act on it every
period; a service that wants the work done at once (a node entered provisioning, a region is being
removed) names the reconciler with `Wake` and calls `wake_after_commit`. Services never import the
reconcilers: the loop subscribes to these wake-ups when it starts (reconcilers/loop.py), and with no
loop running (tests, the CLI) a wake-up simply reaches nobody."""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum

from sqlalchemy import event
from sqlalchemy.orm import Session

from provisioner.providers.base import Feature


class Wake(StrEnum):
    """The reconcilers, by the name they run under (thread `reconcile-<name>`, log lines)."""

    FINALIZE = "finalize"  # provisioning with no finalize report for too long → errored
    REGION_HEALTH = "region-health"  # regions new/healthy/offline from heartbeats
    GCP_PROVIDER = "gcp-provider"  # bootstrap `new` gcp providers, tear down `removing` ones
    GCP_REGIONS = "gcp-regions"  # each gcp region's storage node VM
    GCP_EVENTS = "gcp-events"  # the Pub/Sub consumer of VM events
    GCP_BURST = "gcp-burst"  # jobs' burst VMs: create, delete when done, reap strays; quota cache
    JOBS = "jobs"  # place waiting jobs; fail (or re-queue) the workers of lost nodes
    METERING = "metering"  # post job hours to the ledger; move earned credits daily (docs/billing.md)
    OBJECTS = "objects"  # read datasets', models' and checkpoints' remote sources into the object store


# the reconciler that does a provider's work of each kind (providers/base.py Feature): the one that sets
# up / tears down what it made in the operator's account, and the one that builds / deletes what it made
# for a region
FEATURE_WORK: dict[Feature, Wake] = {
    Feature.BOOTSTRAP: Wake.GCP_PROVIDER,
    Feature.REGION_NODE: Wake.GCP_REGIONS,
}

Subscriber = Callable[[Wake], None]
_subscribers: list[Subscriber] = []


def subscribe(fn: Subscriber) -> None:
    """Call `fn(wake)` on every wake-up from now on (the reconciler loop, while it runs)."""
    if fn not in _subscribers:
        _subscribers.append(fn)


def unsubscribe(fn: Subscriber) -> None:
    if fn in _subscribers:
        _subscribers.remove(fn)


def wake(which: Wake) -> None:
    """Wake `which` now; harmless when nobody listens."""
    for fn in list(_subscribers):
        fn(which)


def wake_after_commit(session: Session, which: Wake) -> None:
    """Wake `which` once `session` commits: woken earlier, the reconciler would look at the store before
    the change that concerns it is visible and go back to sleep for a whole period."""
    event.listen(session, "after_commit", lambda _s: wake(which), once=True)
