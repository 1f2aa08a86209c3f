"""The Google Cloud reconcilers (registered with the loop; the work itself is in services/gcp.py).

- gcp-provider: bootstraps `new` providers (→ enabled / errored) and tears down `removing` ones.
- gcp-regions: creates each region's storage node VM, pins its EK, keeps region health, deletes the
  VM when the region is removed. Names follow `<kind>-provider` / `<kind>-regions`, which the generic
  provider and region services kick on removal.
- gcp-events: keeps the Pub/Sub streaming pull running while a gcp provider is enabled."""

from __future__ import annotations

from sqlalchemy.orm import Session, sessionmaker

from provisioner.reconcilers.loop import register
from provisioner.services import gcp

_events = gcp.EventConsumerSupervisor()


@register("gcp-provider", period_s=5.0)
def reconcile_provider(sessions: sessionmaker[Session]) -> None:
    gcp.bootstrap_step(sessions)


@register("gcp-regions", period_s=3.0)
def reconcile_regions(sessions: sessionmaker[Session]) -> None:
    gcp.storage_nodes_step(sessions)


@register("gcp-events", period_s=5.0)
def reconcile_events(sessions: sessionmaker[Session]) -> None:
    _events.step(sessions)
