"""Every lifecycle of the control plane as data: one enum per resource, one comment per state, one
transition table each, and named sets for the groups of states the rules talk about.

The service layer is the only place that changes a state, always through `services.lifecycle.apply`,
which asks `check()` first and writes the audit line, so an illegal move is refused the same way
whether it comes from an operator, the join protocol or a reconciler. Nothing outside this module
spells a state as a string (tests/provisioner/test_states_single_source.py fails if one does).

`online` is deliberately NOT a state: it is derived from the age of the last heartbeat (`is_online`),
so a node never has two statuses that can disagree. What a node reports about a reservation and the
shapes both sides of the wire share (storage mode, protocol, datastore type) live in
`contracts.regional`; this module only adds the control plane's own view on top."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, TypeVar

from contracts.device_states import InferenceState
from contracts.errors import RuleViolation
from contracts.regional import ReportedState

# A node whose last heartbeat is older than this is shown offline. The minion heartbeats every
# 30 s; three missed beats is the usual threshold before paging anyone.
ONLINE_WINDOW = timedelta(seconds=90)


# ------------------------------------------------------------------------------- operator resources


class ProviderState(StrEnum):
    NEW = "new"  # recorded, provider-side setup not finished yet (GCP: topics, sinks)
    ENABLED = "enabled"  # regions may be created
    ERRORED = "errored"  # setup failed; `reason` says why
    REMOVING = "removing"  # teardown in progress
    REMOVED = "removed"  # kept for the audit trail; the kind may be enabled again


class RegionState(StrEnum):
    NEW = "new"  # created, no node has reported yet
    HEALTHY = "healthy"  # its storage node (if any) and nodes report
    OFFLINE = "offline"  # nothing in it has reported within the online window
    REMOVING = "removing"  # teardown in progress (GCP: storage node deletion)
    REMOVED = "removed"  # kept for the audit trail; the name may be reused
    ERRORED = "errored"  # provider-side failure; `reason` says why


class NodeState(StrEnum):
    NEW = "new"  # added by an operator with its minion_id, waiting for that minion to join
    ENROLLING = "enrolling"  # the minion is joining: EK/AK checks, challenge, quote
    PROVISIONING = "provisioning"  # attested; playbooks finalize the OS
    MAINTENANCE = "maintenance"  # ready but not taking jobs (compute nodes wait here until activated)
    ACTIVE = "active"  # taking jobs
    ERRORED = "errored"  # join or provisioning failed; `reason` says why; retry goes back to new
    REMOVED = "removed"  # kept for history; name and minion_id may be reused


class Service(StrEnum):
    COMPUTE = "compute"
    STORAGE = "storage"
    # an edge inference device (Jetson): a node that runs one inference configuration, never jobs;
    # only in physical regions with central storage (services.nodes), no maintenance step (below)
    DEVICE = "device"


class Maintenance(StrEnum):
    """What `node maintenance` asks for; one enum for the CLI's choices and the service's rule."""

    ON = "on"  # active → maintenance
    OFF = "off"  # maintenance → active
    TOGGLE = "toggle"  # whichever of the two the node's current state allows


PROVIDER_TRANSITIONS: dict[ProviderState, frozenset[ProviderState]] = {
    # NEW → REMOVING: removed while its bootstrap runs; the teardown deletes whatever was made already
    ProviderState.NEW: frozenset(
        {ProviderState.ENABLED, ProviderState.ERRORED, ProviderState.REMOVING, ProviderState.REMOVED}
    ),
    ProviderState.ENABLED: frozenset({ProviderState.REMOVING, ProviderState.REMOVED, ProviderState.ERRORED}),
    ProviderState.ERRORED: frozenset({ProviderState.NEW, ProviderState.REMOVING, ProviderState.REMOVED}),
    ProviderState.REMOVING: frozenset({ProviderState.REMOVED, ProviderState.ERRORED}),
    ProviderState.REMOVED: frozenset(),
}

REGION_TRANSITIONS: dict[RegionState, frozenset[RegionState]] = {
    RegionState.NEW: frozenset(
        {RegionState.HEALTHY, RegionState.OFFLINE, RegionState.ERRORED, RegionState.REMOVING}
    ),
    RegionState.HEALTHY: frozenset({RegionState.OFFLINE, RegionState.ERRORED, RegionState.REMOVING}),
    RegionState.OFFLINE: frozenset({RegionState.HEALTHY, RegionState.ERRORED, RegionState.REMOVING}),
    RegionState.ERRORED: frozenset({RegionState.HEALTHY, RegionState.OFFLINE, RegionState.REMOVING}),
    RegionState.REMOVING: frozenset({RegionState.REMOVED, RegionState.ERRORED}),
    RegionState.REMOVED: frozenset(),
}

NODE_TRANSITIONS: dict[NodeState, frozenset[NodeState]] = {
    NodeState.NEW: frozenset({NodeState.ENROLLING, NodeState.ERRORED, NodeState.REMOVED}),
    NodeState.ENROLLING: frozenset({NodeState.PROVISIONING, NodeState.ERRORED, NodeState.REMOVED}),
    # finalize ok: a compute node waits in maintenance for the operator; a storage node serves its region
    # at once (docs/product-rules.md: storage nodes enter active when provisioning completes)
    NodeState.PROVISIONING: frozenset(
        {NodeState.MAINTENANCE, NodeState.ACTIVE, NodeState.ERRORED, NodeState.REMOVED}
    ),
    NodeState.MAINTENANCE: frozenset({NodeState.ACTIVE, NodeState.ERRORED, NodeState.REMOVED}),
    NodeState.ACTIVE: frozenset({NodeState.MAINTENANCE, NodeState.ERRORED, NodeState.REMOVED}),
    # retry: an errored node starts over from new (waits for its minion to join again)
    NodeState.ERRORED: frozenset({NodeState.NEW, NodeState.REMOVED}),
    NodeState.REMOVED: frozenset(),
}

# A device is a node with the same lifecycle less the maintenance step: new → enrolling → provisioning →
# active as soon as its finalize completes (docs/product-rules.md, "Devices": it "will automatically enter the
# Active state"), errored with a reason, removed. It takes no jobs, so there is nothing to drain: no state
# leads to maintenance (its row stays, unreachable, so the table covers every state).
DEVICE_TRANSITIONS: dict[NodeState, frozenset[NodeState]] = {
    state: out - {NodeState.MAINTENANCE} for state, out in NODE_TRANSITIONS.items()
}

# The transition table of a node by its service: services.nodes.transition picks with it.
NODE_TRANSITIONS_BY_SERVICE: dict[Service, Mapping[NodeState, frozenset[NodeState]]] = {
    Service.COMPUTE: NODE_TRANSITIONS,
    Service.STORAGE: NODE_TRANSITIONS,
    Service.DEVICE: DEVICE_TRANSITIONS,
}


# ------------------------------------------------------------------------------- regional resources


class ReservationState(StrEnum):
    """What the operator wants; `ActualState` is what the assigned node last reported. Kept apart so
    a node that is offline, or a report that arrives after a move, never undoes an operator's decision."""

    UNASSIGNED = "unassigned"  # exists, no node serves it (placement will assign automatically later)
    ASSIGNED = "assigned"  # a compute node of its region should publish it (see actual_state)
    REMOVED = "removed"  # kept for the audit trail; name, hostname and port may be reused


class ActualState(StrEnum):
    """The control plane's view of a reservation on its node: `pending` until the node's first report
    after an assignment, then what the node reported (contracts.regional.ReportedState)."""

    PENDING = "pending"  # assigned; the node has not reported it yet (offline, or before its next heartbeat)
    PUBLISHED = ReportedState.PUBLISHED.value  # HOST.local answers with the node's LAN address
    MAPPED = ReportedState.MAPPED.value  # published, and the router forwards external PORT to it
    CONFLICT = ReportedState.CONFLICT.value  # another host answers for HOST.local; the node stays silent
    ERROR = ReportedState.ERROR.value  # see actual_reason (UPnP 718/606, no IGD, bad entry …)


class DatastoreState(StrEnum):
    ACTIVE = "active"  # usable by jobs of its region
    REMOVED = "removed"  # kept for the audit trail; the name may be reused


RESERVATION_TRANSITIONS: dict[ReservationState, frozenset[ReservationState]] = {
    ReservationState.UNASSIGNED: frozenset({ReservationState.ASSIGNED, ReservationState.REMOVED}),
    # assigned → assigned is a move to another node (one audit line naming both nodes)
    ReservationState.ASSIGNED: frozenset(
        {ReservationState.ASSIGNED, ReservationState.UNASSIGNED, ReservationState.REMOVED}
    ),
    ReservationState.REMOVED: frozenset(),
}

DATASTORE_TRANSITIONS: dict[DatastoreState, frozenset[DatastoreState]] = {
    DatastoreState.ACTIVE: frozenset({DatastoreState.REMOVED}),
    DatastoreState.REMOVED: frozenset(),
}


# ------------------------------------------------------------------------------- data objects


class ObjectState(StrEnum):
    """A dataset, model or checkpoint (services/data/data_objects.py)."""

    DOWNLOADING = "downloading"  # its source is being read (or the CLI is uploading it)
    READY = "ready"  # complete and immutable: jobs may mount it
    FAILED = "failed"  # its source could not be read; `reason` says why; remove it and create it again
    REMOVED = "removed"  # kept for the audit trail; the name may be reused


OBJECT_TRANSITIONS: dict[ObjectState, frozenset[ObjectState]] = {
    ObjectState.DOWNLOADING: frozenset({ObjectState.READY, ObjectState.FAILED, ObjectState.REMOVED}),
    ObjectState.READY: frozenset({ObjectState.REMOVED}),
    ObjectState.FAILED: frozenset({ObjectState.REMOVED}),
    ObjectState.REMOVED: frozenset(),
}


class OutputState(StrEnum):
    """A worker's uploaded /opt/ml/output (services/objects/outputs.py)."""

    KEPT = "kept"  # held by the control plane for `provision job output`; the spec names nowhere else
    PENDING = "pending"  # to be delivered where the spec's data.output says (retried)
    DELIVERED = "delivered"
    FAILED = "failed"  # delivery failed FAILED_AFTER times; `reason` says why; still kept


OUTPUT_TRANSITIONS: dict[OutputState, frozenset[OutputState]] = {
    OutputState.KEPT: frozenset(),
    OutputState.PENDING: frozenset({OutputState.DELIVERED, OutputState.FAILED}),
    OutputState.DELIVERED: frozenset(),
    OutputState.FAILED: frozenset(),
}


# ------------------------------------------------------------------------------- device configurations


class DeviceConfigState(StrEnum):
    ACTIVE = "active"  # devices may be set to it and deployed (each update adds a revision)
    REMOVED = "removed"  # kept for the audit trail; the name may be reused; no device may still use it


DEVICE_CONFIG_TRANSITIONS: dict[DeviceConfigState, frozenset[DeviceConfigState]] = {
    DeviceConfigState.ACTIVE: frozenset({DeviceConfigState.REMOVED}),
    DeviceConfigState.REMOVED: frozenset(),
}

# What a device's inference container does is observed, not decided (the minion reports it:
# contracts.device.InferenceState, re-exported here); these end only with a new deploy (or a reboot).
INFERENCE_ENDED: frozenset[InferenceState] = frozenset({InferenceState.EXITED, InferenceState.FAILED})


# ------------------------------------------------------------------------------- jobs


class JobState(StrEnum):
    """A job's lifecycle (OpenPAI's states); its workers' states decide the end (services.jobs)."""

    WAITING = "waiting"  # nothing fits now (reason: "Waiting for GPUs: …"); placed when capacity appears
    STARTING = "starting"  # placed on nodes; their minions have not reported every worker running yet
    RUNNING = "running"  # every worker's container runs (a gang), or one at least (an independent job)
    SUCCEEDED = "succeeded"  # every worker exited 0
    FAILED = "failed"  # a gang's worker failed; an independent job ended with a failed worker (it says which)
    STOPPED = "stopped"  # `provision job stop`: SIGTERM, grace period, then kill


class WorkerState(StrEnum):
    """One container of a job (one per worker of its groups), on one node, with its own exit code."""

    WAITING = "waiting"  # no node yet (the job waits, or was re-queued)
    STARTING = "starting"  # assigned to a node; its minion has not reported the container running yet
    RUNNING = "running"  # the container runs
    SUCCEEDED = "succeeded"  # exit code 0
    FAILED = "failed"  # non-zero exit code, failed to start, or its node went offline/errored
    STOPPED = "stopped"  # stopped by the operator (or because a sibling failed)


JOB_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.WAITING: frozenset({JobState.STARTING, JobState.STOPPED, JobState.FAILED}),
    # STARTING → WAITING: its node went away before any worker started; the job is re-queued
    JobState.STARTING: frozenset(
        {JobState.WAITING, JobState.RUNNING, JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED}
    ),
    # RUNNING → WAITING: a training job whose GCP Spot VM was preempted is re-queued once (gcp_burst)
    JobState.RUNNING: frozenset({JobState.WAITING, JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED}),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.STOPPED: frozenset(),
}

WORKER_TRANSITIONS: dict[WorkerState, frozenset[WorkerState]] = {
    WorkerState.WAITING: frozenset({WorkerState.STARTING, WorkerState.STOPPED, WorkerState.FAILED}),
    # STARTING → WAITING: re-queued with its job (a new generation on the next node)
    WorkerState.STARTING: frozenset(
        {
            WorkerState.WAITING,
            WorkerState.RUNNING,
            WorkerState.SUCCEEDED,
            WorkerState.FAILED,
            WorkerState.STOPPED,
        }
    ),
    # RUNNING → WAITING: re-queued with its training job after a Spot VM preemption (gcp_burst)
    WorkerState.RUNNING: frozenset(
        {WorkerState.WAITING, WorkerState.SUCCEEDED, WorkerState.FAILED, WorkerState.STOPPED}
    ),
    WorkerState.SUCCEEDED: frozenset(),
    WorkerState.FAILED: frozenset(),
    WorkerState.STOPPED: frozenset(),
}

# A job or worker that still holds (or waits for) capacity: what the placement counts as busy and
# what `job stop` may stop.
JOB_LIVE: frozenset[JobState] = frozenset({JobState.WAITING, JobState.STARTING, JobState.RUNNING})
JOB_ON_NODE: frozenset[JobState] = frozenset({JobState.STARTING, JobState.RUNNING})
WORKER_ON_NODE: frozenset[WorkerState] = frozenset({WorkerState.STARTING, WorkerState.RUNNING})
WORKER_DONE: frozenset[WorkerState] = frozenset(
    {WorkerState.SUCCEEDED, WorkerState.FAILED, WorkerState.STOPPED}
)
JOB_DONE: frozenset[JobState] = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED})


# ------------------------------------------------------------------------------- GCP storage node VM


class VmStatus(StrEnum):
    """How far a GCP region's storage node VM got; the reconciler moves along this, never backwards."""

    PENDING = "pending"  # recorded by `region create`, no insert sent yet
    CREATING = "creating"  # insert sent (requestId derived from our ids); resumable
    CREATED = "created"  # the VM exists in `zone`; its EK is not pinned yet
    READY = "ready"  # EK pinned on the node: the VM may join with attestation
    DELETING = "deleting"  # region removal: delete sent
    DELETED = "deleted"  # the VM and its disks are gone
    FAILED = "failed"  # every zone refused; `error` says why


VM_TRANSITIONS: dict[VmStatus, frozenset[VmStatus]] = {
    VmStatus.PENDING: frozenset({VmStatus.CREATING, VmStatus.DELETING, VmStatus.FAILED}),
    VmStatus.CREATING: frozenset({VmStatus.CREATED, VmStatus.DELETING, VmStatus.FAILED}),
    VmStatus.CREATED: frozenset({VmStatus.READY, VmStatus.DELETING}),
    VmStatus.READY: frozenset({VmStatus.DELETING}),
    VmStatus.FAILED: frozenset({VmStatus.DELETING}),
    VmStatus.DELETING: frozenset({VmStatus.DELETED}),
    VmStatus.DELETED: frozenset(),
}


# ------------------------------------------------------------------------------- GCP burst VM


class BurstVmState(StrEnum):
    """How far the ephemeral GCP VM of one job worker got (services/cloud/gcp_burst.py). The row is written
    before the insert call, so a control plane killed anywhere finds it and resumes (requestId)."""

    PENDING = "pending"  # placed there; row written, no insert sent yet
    CREATING = "creating"  # insert sent (requestId derived from our ids); resumable
    CREATED = "created"  # the VM exists in `zone`: its node joins and runs the job
    DELETING = "deleting"  # the job ended (or was re-queued, preempted): delete sent
    DELETED = "deleted"  # the VM and its disks are gone
    FAILED = "failed"  # every zone refused; the job went back to waiting with the reason


BURST_VM_TRANSITIONS: dict[BurstVmState, frozenset[BurstVmState]] = {
    BurstVmState.PENDING: frozenset({BurstVmState.CREATING, BurstVmState.DELETING, BurstVmState.FAILED}),
    BurstVmState.CREATING: frozenset({BurstVmState.CREATED, BurstVmState.DELETING, BurstVmState.FAILED}),
    BurstVmState.CREATED: frozenset({BurstVmState.DELETING}),
    BurstVmState.DELETING: frozenset({BurstVmState.DELETED}),
    BurstVmState.FAILED: frozenset(),
    BurstVmState.DELETED: frozenset(),
}
# A burst VM that holds (or is about to hold) quota in its region: what GCP capacity subtracts.
BURST_VM_LIVE: frozenset[BurstVmState] = frozenset(
    {BurstVmState.PENDING, BurstVmState.CREATING, BurstVmState.CREATED, BurstVmState.DELETING}
)


# ------------------------------------------------------------------------------- trust and join
# These rows are deleted (keys, CAs) or only stamped (tokens), so their states appear in the audit trail
# and the API's answers rather than in a `state` column; they still have exactly one spelling, here.


class TrustState(StrEnum):
    """An image-builder signing key or a TPM vendor CA the operator trusts (`image trust-key`,
    `tpm-ca add`); untrusting deletes the row and audits `removed`."""

    TRUSTED = "trusted"  # signatures / EK certificates chaining to it are accepted
    REMOVED = "removed"  # no longer trusted; the audit line keeps its fingerprint


class ImageState(StrEnum):
    REGISTERED = "registered"  # a signed manifest of the region: nodes matching it pass attestation
    REMOVED = "removed"  # unregistered (or its key untrusted); nodes running it no longer attest


class PublicationState(StrEnum):
    """A registered image on a cloud provider (`provision image publish`, services/cloud/image_publish.py):
    the
    GCE target uploaded to the project's image bucket, then imported with images.insert."""

    UPLOADING = "uploading"  # a resumable upload session was handed to the CLI; the object is not complete
    IMPORTING = "importing"  # the object matched what was declared; images.insert sent (requestId)
    PUBLISHED = "published"  # the image is READY in its family: the region's new VMs boot it
    FAILED = "failed"  # the upload did not match, or Compute could not import it; `reason` says why


class JoinTokenState(StrEnum):
    ISSUED = "issued"  # usable until `expires_at`
    EXPIRED = "expired"  # derived: `expires_at` passed; joins presenting it are refused
    REVOKED = "revoked"  # `revoked_at` is set: joins presenting it are refused


class MinionRejection(StrEnum):
    """`provision node reject` / `unreject`: a minion_id (its EK) whose joins are refused. The row exists
    while it is rejected; the audit trail keeps both transitions."""

    REJECTED = "rejected"  # every join from it is refused (join_minion_rejected), audited
    LIFTED = "lifted"  # `node unreject`: it may join (and show as pending) again


class OperatorTokenState(StrEnum):
    """Derived from the row (services.tokens): revocation and expiry are checked on every request."""

    LIVE = "live"  # accepted
    EXPIRED = "expired"  # `expires_at` passed: refused; `provision token rotate` gives it a new secret
    REVOKED = "revoked"  # `revoked_at` is set: refused for good


class JoinOutcome(StrEnum):
    """What a join or heartbeat ends in when it is not a node state: the `state` of a join answer and
    of `node pending` rows, and the audit line of a refusal."""

    PENDING = "pending"  # attested, but no operator has added a node with its minion_id yet
    REFUSED = "refused"  # a refusal, audited with its code (join or heartbeat)


class MinionIdentity(StrEnum):
    """What a minion proved itself with at join (node_attestations.identity, pending_minions.identity)."""

    TPM = "tpm"  # its TPM's EK and AK: the attested join, then quotes
    DEVICE_KEY = "device-key"  # a device without a TPM: a key file on the device, then signatures


TRUST_TRANSITIONS: dict[TrustState, frozenset[TrustState]] = {
    TrustState.TRUSTED: frozenset({TrustState.REMOVED}),
    TrustState.REMOVED: frozenset(),
}

IMAGE_TRANSITIONS: dict[ImageState, frozenset[ImageState]] = {
    ImageState.REGISTERED: frozenset({ImageState.REMOVED}),
    ImageState.REMOVED: frozenset(),
}

# failed → uploading: `publish` again starts over (a new upload session, the same image name and requestId)
PUBLICATION_TRANSITIONS: dict[PublicationState, frozenset[PublicationState]] = {
    PublicationState.UPLOADING: frozenset({PublicationState.IMPORTING, PublicationState.FAILED}),
    PublicationState.IMPORTING: frozenset({PublicationState.PUBLISHED, PublicationState.FAILED}),
    PublicationState.PUBLISHED: frozenset(),
    PublicationState.FAILED: frozenset({PublicationState.UPLOADING}),
}

JOIN_TOKEN_TRANSITIONS: dict[JoinTokenState, frozenset[JoinTokenState]] = {
    JoinTokenState.ISSUED: frozenset({JoinTokenState.EXPIRED, JoinTokenState.REVOKED}),
    JoinTokenState.EXPIRED: frozenset({JoinTokenState.REVOKED}),  # revoking it stops it for good
    JoinTokenState.REVOKED: frozenset(),
}


MINION_REJECTION_TRANSITIONS: dict[MinionRejection, frozenset[MinionRejection]] = {
    MinionRejection.REJECTED: frozenset({MinionRejection.LIFTED}),
    MinionRejection.LIFTED: frozenset(),  # the row is gone; a new `reject` starts a new rejection
}


OPERATOR_TOKEN_TRANSITIONS: dict[OperatorTokenState, frozenset[OperatorTokenState]] = {
    OperatorTokenState.LIVE: frozenset({OperatorTokenState.EXPIRED, OperatorTokenState.REVOKED}),
    OperatorTokenState.EXPIRED: frozenset({OperatorTokenState.LIVE, OperatorTokenState.REVOKED}),  # rotate
    OperatorTokenState.REVOKED: frozenset(),
}


def join_token_state(
    revoked_at: datetime | None, expires_at: datetime | None = None, now: datetime | None = None
) -> JoinTokenState:
    """A token's state is derived from its row (expiry is also checked at use, see services.join_tokens)."""
    if revoked_at is not None:
        return JoinTokenState.REVOKED
    if expires_at is not None and (now or datetime.now(UTC)) > _aware(expires_at):
        return JoinTokenState.EXPIRED
    return JoinTokenState.ISSUED


def _aware(at: datetime) -> datetime:
    """SQLite gives naive datetimes back; the store writes UTC."""
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


# ------------------------------------------------------------------------------- tables and named sets

# Every lifecycle enum and its transition table (the single-source test checks each covers its enum).
TABLES: dict[type[StrEnum], Mapping[Any, frozenset[Any]]] = {
    ProviderState: PROVIDER_TRANSITIONS,
    RegionState: REGION_TRANSITIONS,
    NodeState: NODE_TRANSITIONS,
    ReservationState: RESERVATION_TRANSITIONS,
    DatastoreState: DATASTORE_TRANSITIONS,
    VmStatus: VM_TRANSITIONS,
    BurstVmState: BURST_VM_TRANSITIONS,
    TrustState: TRUST_TRANSITIONS,
    ImageState: IMAGE_TRANSITIONS,
    PublicationState: PUBLICATION_TRANSITIONS,
    JoinTokenState: JOIN_TOKEN_TRANSITIONS,
    MinionRejection: MINION_REJECTION_TRANSITIONS,
    OperatorTokenState: OPERATOR_TOKEN_TRANSITIONS,
    JobState: JOB_TRANSITIONS,
    WorkerState: WORKER_TRANSITIONS,
    DeviceConfigState: DEVICE_CONFIG_TRANSITIONS,
    ObjectState: OBJECT_TRANSITIONS,
    OutputState: OUTPUT_TRANSITIONS,
}

# The states whose `reason` is kept: errored says why it failed; offline says why it went away
# (e.g. a GCP storage node was preempted). Any other transition clears the reason.
# A job keeps why it waits, failed or stopped ("Waiting for GPUs: …", "worker 1 exited with code 3").
KEEPS_REASON: frozenset[StrEnum] = frozenset(
    {
        ProviderState.ERRORED,
        RegionState.ERRORED,
        RegionState.OFFLINE,
        NodeState.ERRORED,
        PublicationState.FAILED,
        ObjectState.FAILED,
        OutputState.FAILED,
        JobState.WAITING,
        JobState.FAILED,
        JobState.STOPPED,
        WorkerState.FAILED,
        WorkerState.STOPPED,
    }
)

# A region on its way out or gone: no join, no new node, no storage VM.
REGION_LEAVING: frozenset[RegionState] = frozenset({RegionState.REMOVING, RegionState.REMOVED})
# A region the GCP reconcilers leave alone (nothing left to mark errored).
REGION_SETTLED_BAD: frozenset[RegionState] = frozenset({RegionState.ERRORED, *REGION_LEAVING})

# A node that finished provisioning (what the lab waits for); only an active one takes jobs.
NODE_READY: frozenset[NodeState] = frozenset({NodeState.MAINTENANCE, NodeState.ACTIVE})
# not joined and finalized yet: maintenance on/off means nothing for these
NODE_AWAITING_MINION: frozenset[NodeState] = frozenset(
    {NodeState.NEW, NodeState.ENROLLING, NodeState.PROVISIONING}
)
NODE_SCHEDULABLE: frozenset[NodeState] = frozenset({NodeState.ACTIVE})
# A node that will not get ready without an operator (retry, or add it again).
NODE_STOPPED: frozenset[NodeState] = frozenset({NodeState.ERRORED, NodeState.REMOVED})

# A provider whose bootstrap will not end enabled without an operator (`gcp enable --wait` gives up).
PROVIDER_FAILED_OR_GONE: frozenset[ProviderState] = frozenset(
    {ProviderState.ERRORED, ProviderState.REMOVING, ProviderState.REMOVED}
)

# The final state of each lifecycle: the row stays for the audit trail and frees its unique names.
TERMINAL: frozenset[StrEnum] = frozenset(
    state for table in TABLES.values() for state, out in table.items() if not out
)

E = TypeVar("E", bound=StrEnum)


def check(kind: str, name: str, table: Mapping[E, frozenset[E]], current: E, target: E) -> None:
    """Refuse an illegal transition with a sentence naming the current state and the way out."""
    if target in table[current]:
        return
    allowed = ", ".join(sorted(s.value for s in table[current])) or "nothing (it is final)"
    raise RuleViolation(
        f"{kind} '{name}' is {current.value} and cannot go to {target.value}: "
        f"from {current.value} it can go to {allowed}",
        code="illegal_transition",
    )


def is_online(last_heartbeat_at: datetime | None, now: datetime | None = None) -> bool:
    """A node is online when it heartbeated within ONLINE_WINDOW; never-seen nodes are offline."""
    if last_heartbeat_at is None:
        return False
    now = now or datetime.now(UTC)
    if last_heartbeat_at.tzinfo is None:
        last_heartbeat_at = last_heartbeat_at.replace(tzinfo=UTC)
    return now - last_heartbeat_at <= ONLINE_WINDOW
