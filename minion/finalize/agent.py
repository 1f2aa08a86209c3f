"""The desired-state handler for `finalize` (contracts/finalize.py): run the work in the background when
its generation differs from the last one applied, post its events and outcome, report where it stands.

`minion run` calls setup(ctx) once (minion/join/run.py RUN_HOOKS). Every heartbeat answer then hands
desired["finalize"] to FinalizeAgent.handle, which never blocks the heartbeat: a new generation starts a
thread that downloads the bundle, runs the play and posts FinalizeReports (events in batches of at most
EVENTS_PER_REPORT, the outcome with the last batch). The returned actual state:

    {"generation": <last applied or None>, "running": <generation being run or None>,
     "state": "applied" | "running" | "failed" | "pending" | "refused", "message": <why it failed>,
     "facts": {"scratch": {...}, "storage": {...}}}

A generation that failed is not run again by itself: the control plane answers with a new generation on
`provision node retry` or when a variable changes. A download that cannot reach the control plane is
retried at the next heartbeat (state "pending"). A minion without --host-root on a machine that is not a
rigbase node image (runner.NODE_IMAGE_MARKER: a developer's machine, CI) runs nothing and reports nothing
(state "refused"); its node stays in provisioning until the control plane's finalize timeout."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import httpx
from pydantic import ValidationError

from contracts.finalize import (
    EVENTS_PER_REPORT,
    REPORT_ROUTE,
    FinalizeEvent,
    FinalizeOutcome,
    FinalizeReport,
    FinalizeRunState,
    FinalizeStatus,
    FinalizeWork,
)
from contracts.heartbeat_keys import HeartbeatKey
from minion import desired
from minion.finalize import saved
from minion.finalize.apply import apply_work
from minion.finalize.bundle import BundleProblem, download
from minion.finalize.live import live_state
from minion.finalize.paths import FinalizePaths
from minion.finalize.process import RunBusy
from minion.finalize.runner import RunResult, not_a_node, read_facts
from minion.join.client import ConnectionProblem, ControlPlane

log = logging.getLogger(__name__)

FLUSH_SECONDS: Final = 2.0  # events go out at least this often while a play runs
POST_ATTEMPTS: Final = 5


@dataclass
class FinalizeAgent:
    cp: ControlPlane
    node: dict[str, Any]  # node.json: node_id, node_credential (the run loop's, kept current)
    paths: FinalizePaths
    host_root: Path | None = None
    collections: Path | None = None
    applied: str | None = None
    running: str | None = None
    failed: str | None = None
    message: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        self.applied = saved.applied_generation(self.paths)
        self.facts = read_facts(self.host_root) if self.applied else {}

    # -- the handler -----------------------------------------------------------------------------------
    def handle(self, value: Any) -> dict[str, Any]:
        try:
            work = FinalizeWork.model_validate(value)
        except ValidationError as exc:
            with self.lock:
                self.message = f"unreadable finalize work: {exc.error_count()} problem(s)"
            return self.actual(None)
        refusal = not_a_node(self.host_root)
        with self.lock:
            start = (
                not refusal and self.running is None and work.generation not in (self.applied, self.failed)
            )
            if start:
                self.running, self.message = work.generation, None
            elif refusal:  # nothing runs and nothing is reported: the control plane's timeout says so
                self.message = refusal
        if start:
            self.thread = threading.Thread(target=self._run, args=(work,), name="finalize", daemon=True)
            self.thread.start()
        return self.actual(work.generation)

    def actual(self, wanted: str | None) -> dict[str, Any]:
        with self.lock:
            if self.running:
                state = FinalizeRunState.RUNNING
            elif self.host_root is None and not_a_node(None):
                state = FinalizeRunState.REFUSED
            elif wanted is not None and wanted == self.failed:
                state = FinalizeRunState.FAILED
            elif wanted is None or wanted == self.applied:
                state = FinalizeRunState.APPLIED if self.applied else FinalizeRunState.PENDING
            else:
                state = FinalizeRunState.PENDING
            applied, running, message, facts = self.applied, self.running, self.message, self.facts
        # a real node: what is mounted and exported now
        live = live_state(facts) if self.host_root is None and facts else None
        status = FinalizeStatus(
            generation=applied, running=running, state=state, message=message, facts=facts, live=live
        )
        return status.model_dump(mode="json")

    # -- one run ---------------------------------------------------------------------------------------
    def _run(self, work: FinalizeWork) -> None:
        reporter = Reporter(self, work.generation)
        result: RunResult | None = None
        try:
            bundle = download(self.cp.http, work, self.node["node_credential"])
            result = apply_work(
                work,
                bundle,
                self.paths,
                host_root=self.host_root,
                collections=self.collections,
                on_event=reporter.add,
            )
        except BundleProblem as exc:
            result = RunResult(FinalizeOutcome(ok=False, message=str(exc)))
        except (httpx.TransportError, RunBusy) as exc:  # try again at the next heartbeat
            with self.lock:
                self.running, self.message = None, f"finalize postponed: {exc}"
            return
        except Exception as exc:
            log.exception("finalize of generation %s crashed", work.generation)
            result = RunResult(
                FinalizeOutcome(ok=False, message=f"the minion's finalize crashed: {exc}"[:1000])
            )
        with self.lock:
            self.running = None
            if result.outcome.ok:
                self.applied, self.failed, self.message = work.generation, None, None
            else:
                self.failed = work.generation
                self.message = result.outcome.message or f"task {result.outcome.failed_task!r} failed"
            if result.facts:
                self.facts = result.facts
        reporter.finish(result)


@dataclass
class Reporter:
    """Queues a run's events and posts them as FinalizeReports, in batches, with the outcome at the end."""

    agent: FinalizeAgent
    generation: str
    events: list[FinalizeEvent] = field(default_factory=list)
    last_post: float = field(default_factory=time.monotonic)
    gone: bool = False  # the control plane answered 409: this generation is no longer the node's

    def add(self, event: FinalizeEvent) -> None:
        self.events.append(event)
        if len(self.events) >= EVENTS_PER_REPORT or time.monotonic() - self.last_post >= FLUSH_SECONDS:
            self._post(self._take(), None, None)

    def finish(self, result: RunResult) -> None:
        while len(self.events) > EVENTS_PER_REPORT:
            self._post(self._take(), None, None)
        self._post(self._take(), result.outcome, result.facts or None)

    def _take(self) -> list[FinalizeEvent]:
        batch, self.events = self.events[:EVENTS_PER_REPORT], self.events[EVENTS_PER_REPORT:]
        return batch

    def _post(self, events: list[FinalizeEvent], outcome: FinalizeOutcome | None, facts: Any) -> None:
        self.last_post = time.monotonic()
        if self.gone or (not events and outcome is None):
            return
        report = FinalizeReport(generation=self.generation, events=events, outcome=outcome, facts=facts)
        path = REPORT_ROUTE.format(node_id=self.agent.node["node_id"])
        for attempt in range(POST_ATTEMPTS):
            try:
                response = self.agent.cp.post(
                    path, report.model_dump(mode="json"), token=self.agent.node["node_credential"]
                )
            except ConnectionProblem as exc:
                log.warning("finalize report not delivered (%s); retrying", exc)
                time.sleep(min(2**attempt, 15))
                continue
            if response.status_code == 409:
                self.gone = True
            elif response.status_code >= 400:
                log.warning("finalize report refused: HTTP %s %s", response.status_code, response.text[:200])
            return


def setup(ctx: Any) -> None:
    """Register the `finalize` handler for this `minion run` (ctx: minion.join.run.RunContext)."""
    agent = FinalizeAgent(
        cp=ControlPlane(ctx.enrollment),
        node=ctx.node,
        paths=FinalizePaths(ctx.state.path),
        host_root=ctx.host_root,
        collections=ctx.ansible_collections,
    )

    def handle(value: Any) -> dict[str, Any]:
        agent.node = ctx.node  # a rejoin replaces the node record (new credential)
        return agent.handle(value)

    desired.register(HeartbeatKey.FINALIZE, handle)
    desired.on_shutdown(agent.cp.close)
