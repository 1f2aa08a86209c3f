"""What a GCP storage node's VM events mean for the store (the events reconciler feeds them here).

How "offline" maps onto the state tables: `online` is derived from heartbeats and the node lifecycle
(new … active) describes the node's software, not whether its VM runs. So a stopped or preempted
storage node moves its REGION to `offline` with the reason (the region cannot serve without it), and
`gcp_storage_nodes.running` records what Compute said; the node itself keeps its lifecycle state and
shows offline by itself once its heartbeats stop. A VM deleted behind rigbase's back makes the node and
the region `errored` with that reason.

A job's burst VM (services/cloud/gcp_burst.py) that is preempted, stopped or deleted outside rigbase loses its
job its node: a training job is re-queued once, any other job fails, with the event in the job's
history."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from provisioner.domain.states import (
    NODE_TRANSITIONS,
    REGION_LEAVING,
    REGION_TRANSITIONS,
    BurstVmState,
    NodeState,
    RegionState,
    VmStatus,
)
from provisioner.providers.base import NodeEvent, NodeEventKind
from provisioner.services.cloud import gcp_burst
from provisioner.services.fleet import nodes as node_service
from provisioner.services.jobs import gcp_preemption
from provisioner.services.regions import regions as region_service
from provisioner.store.engine import session_scope
from provisioner.store.gcp_models import GcpStorageNode
from provisioner.store.models import Node, Region

ACTOR = "gcp:events"


def apply_event(sessions: sessionmaker[Session], event: NodeEvent) -> None:  # noqa: C901
    """One instance event → store. Raising makes the consumer nack, so Pub/Sub redelivers it."""
    with session_scope(sessions) as s:
        burst = gcp_burst.live_by_instance(s, event.instance)
        if burst is not None and burst.job_id is None:
            # a permanent compute node: stopped or started, its heartbeats tell; deleted behind our back,
            # it is gone for good (the reconciler finds nothing to delete and removes its node)
            if event.kind is NodeEventKind.DELETED:
                why = f"VM {event.instance} {event.reason} ({event.method}): deleted outside rigbase"
                gcp_burst.move(s, burst, BurstVmState.DELETING, actor=ACTOR, reason=why)
            return
        if burst is not None:
            # a job's burst VM stopped, was preempted or deleted behind our back: its job lost its node
            if event.kind is not NodeEventKind.STARTED:
                when = event.timestamp or "unknown time"
                why = f"VM {event.instance} {event.reason} ({event.method} at {when})"
                gcp_preemption.preempted(s, burst, why=why, actor=ACTOR)
            return
        rec = s.scalar(
            select(GcpStorageNode).where(
                GcpStorageNode.instance_name == event.instance,
                GcpStorageNode.status != VmStatus.DELETED.value,
            )
        )
        if rec is None:
            return  # not (or no longer) one of our storage nodes
        # the foreign keys keep both rows (removal only changes their state)
        region, node = s.get_one(Region, rec.region_id), s.get_one(Node, rec.node_id)
        state = RegionState(region.state)
        if state in REGION_LEAVING or VmStatus(rec.status) == VmStatus.DELETING:
            return  # our own removal
        why = (
            f"storage node {node.name} {event.reason} ({event.method} at {event.timestamp or 'unknown time'})"
        )
        gone = f"{why}: deleted outside rigbase; remove the region and create it again"
        if event.kind is NodeEventKind.OFFLINE:
            rec.running = False
            if state != RegionState.OFFLINE and RegionState.OFFLINE in REGION_TRANSITIONS[state]:
                region_service.transition(s, region, RegionState.OFFLINE, actor=ACTOR, reason=why)
        elif event.kind is NodeEventKind.STARTED:
            rec.running = (
                True  # healthy again once the node is active (the storage-node reconciler's health step)
            )
        elif event.kind is NodeEventKind.DELETED:
            rec.running = False
            if NodeState.ERRORED in NODE_TRANSITIONS[NodeState(node.state)]:
                node_service.transition(s, node, NodeState.ERRORED, actor=ACTOR, reason=gone)
            if state != RegionState.ERRORED:
                region_service.transition(s, region, RegionState.ERRORED, actor=ACTOR, reason=gone)
