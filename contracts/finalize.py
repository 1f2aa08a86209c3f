"""On-node finalize, as both ends agree on it (docs/join-protocol.md, "Finalize").

The control plane never opens a connection to a node. Once a node is attested, every heartbeat answer
carries the node's finalize work under `desired["finalize"]` (a FinalizeWork): which playbook of which
playbook bundle to run, with which variables. The minion fetches the bundle over its own outbound
connection (GET /v1/finalize/bundles/{digest}, node credential), checks its SHA-256 against the digest,
runs the playbook locally through ansible-runner and posts the task events and the outcome to
POST /v1/nodes/{node_id}/finalize as FinalizeReports.

`generation` names one converged configuration (a digest over the bundle digest, the playbook, the
variables and the control plane's retry counter). The minion runs the work whenever the generation
differs from the last one it applied successfully — at first finalize, after `provision node retry`, and
when the control plane changes a variable (a replaced storage node's address) — and keeps the last applied
work and bundle on its state partition, so it can apply it again at every boot before it joins (the root
is read-only; what finalize wrote under /etc is gone after a reboot)."""

from __future__ import annotations

import hashlib
import json
from enum import StrEnum
from typing import Annotated, Any, Final

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from contracts.messages import Report

BUNDLE_ROUTE: Final = "/v1/finalize/bundles/{digest}"
REPORT_ROUTE: Final = "/v1/nodes/{node_id}/finalize"
BUNDLE_MEDIA_TYPE: Final = "application/gzip"
BUNDLE_MAX_BYTES: Final = 8 * 2**20  # a playbook bundle is tens of KiB; the minion refuses a larger download
EVENTS_PER_REPORT: Final = 100  # a report carries at most this many events; a longer play posts several
TASK_NAME_MAX: Final = 200
MESSAGE_MAX: Final = 1000
# The Python a node runs Ansible modules with (minion/finalize/module_python.py): the image builder installs
# this launcher beside ansible-playbook; the minion's runner finds it on PATH or beside its own launcher.
MODULE_PYTHON: Final = "rigbase-ansible-python"
MODULE_PYTHON_ENTRY: Final = ("minion.finalize.module_python", "main")

# pydantic-core matches with Rust regex, whose `$` is the end of the text (no trailing newline): a full match
Sha256Hex = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class TaskStatus(StrEnum):
    STARTED = "started"
    OK = "ok"
    CHANGED = "changed"
    SKIPPED = "skipped"
    FAILED = "failed"
    IGNORED = "ignored"  # failed with ignore_errors: part of the play's logic, not a finalize failure
    UNREACHABLE = "unreachable"


FAILING: Final = frozenset({TaskStatus.FAILED, TaskStatus.UNREACHABLE})


class FinalizeWork(BaseModel):
    """desired["finalize"] in a heartbeat answer (control plane → minion; unknown fields ignored)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    generation: Sha256Hex
    bundle_digest: Sha256Hex  # SHA-256 of the bundle's bytes (a gzip'd tar of the playbook directory)
    playbook: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]*\.yml$")  # at the bundle's top level
    variables: dict[str, Any] = Field(default_factory=dict)

    @property
    def bundle_path(self) -> str:
        return BUNDLE_ROUTE.format(digest=self.bundle_digest)


def generation_of(bundle_digest: str, playbook: str, variables: dict[str, Any], retry: int = 0) -> str:
    """The generation of a finalize work: equal inputs give an equal generation on any machine."""
    canonical = json.dumps(
        {"bundle": bundle_digest, "playbook": playbook, "variables": variables, "retry": retry},
        sort_keys=True,
        separators=(",", ":"),
        default=str,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


class FinalizeEvent(BaseModel):
    """One task event of a run, as it goes into the node's history."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task: str = Field(min_length=1, max_length=TASK_NAME_MAX)
    status: TaskStatus
    message: str | None = Field(None, max_length=MESSAGE_MAX)
    handler: bool = False


class FinalizeOutcome(BaseModel):
    """How a run ended. `failed_task` is None for a run that failed outside a task (a bundle with a wrong
    digest, a syntax error, ansible-playbook missing): `message` then says what."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ok: bool
    failed_task: str | None = Field(None, max_length=TASK_NAME_MAX)
    message: str | None = Field(None, max_length=MESSAGE_MAX)
    changed: int = Field(0, ge=0)
    seconds: float = Field(0.0, ge=0)


class FinalizeRunState(StrEnum):
    PENDING = "pending"  # not yet applied, or a newer generation waits
    RUNNING = "running"
    APPLIED = "applied"  # the generation asked for is the one applied
    FAILED = "failed"  # the generation asked for failed; a retry is a new generation
    REFUSED = "refused"  # not a rigbase node: the minion does not run the playbook here


class FinalizeStatus(BaseModel):
    """actual["finalize"] in a heartbeat: what the minion says of its finalize, shown by `provision node
    show`. `live` (a real node only: what is mounted and exported now) is left out when absent."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    generation: Sha256Hex | None  # the last generation applied
    running: Sha256Hex | None  # the generation running now
    state: FinalizeRunState
    message: str | None
    facts: Report | None
    live: Report | None = None

    @model_serializer(mode="wrap")
    def _without_absent_live(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if self.live is None:
            data.pop("live", None)
        return data


class FinalizeReport(BaseModel):
    """POST /v1/nodes/{node_id}/finalize body (minion → control plane, node credential): events of the
    run of `generation` so far, and its outcome once it ended. A report for a generation that is not the
    node's current one is answered 409 and changes nothing."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    generation: Sha256Hex
    events: list[FinalizeEvent] = Field(default_factory=list, max_length=EVENTS_PER_REPORT)
    outcome: FinalizeOutcome | None = None
    facts: Report | None = None  # what the play found, e.g. {"scratch": {"device": "/dev/md/scratch"}}
