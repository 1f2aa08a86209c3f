"""GET /metrics: the fleet for Prometheus, in its exposition format, through the official client library
(docs/monitoring.md; a Grafana dashboard for it: deploy/grafana/rigbase-fleet.json).

Two kinds of series, one registry per app:
- what the store holds, read at each scrape by FleetCollector (services/jobs/fleet_summary.py): nodes
  by region, state and GPU type; GPUs total, allocated and healthy; jobs by state; the waiting queue and
  its oldest job; the ledger's totals.
  Every process on a store answers the same, so a scrape of any one of them is the fleet;
- what this process saw, since it started: request latency by route (the heartbeat's and the join's among
  them: their rates are the histograms' counts), refusals by their code, and each reconciler's last pass
  (the leader's: another process runs none).

Who may scrape (api/deps.py Scraper): a token of role `scrape` (the root account's, made for a Prometheus
server), or an admin token of the root account. Anything else gets the API's one-line 401 or 403."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any, Final

from fastapi import APIRouter, Request, Response
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from provisioner.api.deps import Db, Scraper
from provisioner.domain import billing_rules as rules
from provisioner.domain.states import JobState
from provisioner.services.jobs import fleet_summary
from provisioner.store.billing_models import LedgerEntry

METRICS_PATH: Final = "/metrics"
NAMESPACE: Final = "rigbase"
# request latency buckets: a steady heartbeat answers in a few ms, a join with its TPM checks in tens
LATENCY_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
REFUSAL_BODY_MAX: Final = 4096  # an API refusal is one short line; a longer error body is not read


class FleetCollector(Collector):
    """The store's side of the metrics, read at each scrape (module docstring)."""

    def __init__(self, loop_of: Any) -> None:
        self.loop_of = loop_of  # () → the app's ReconcilerLoop or None
        # the scrape's own unit of work (its request's session: a second connection could wait on the
        # pool the admission bounds); one scrape at a time
        self.session: Session | None = None
        self.lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        if self.session is not None:
            yield from self._nodes_and_gpus(self.session)
            yield from self._jobs(self.session)
            yield from self._ledger(self.session)
        yield from self._reconcilers()

    def _nodes_and_gpus(self, session: Session) -> Iterator[Metric]:
        nodes = GaugeMetricFamily(
            f"{NAMESPACE}_nodes",
            "Nodes by region, state and GPU type",
            labels=["region", "state", "gpu_type"],
        )
        gpus = GaugeMetricFamily(
            f"{NAMESPACE}_gpus",
            "GPUs by region and type: total, allocated to workers, and healthy (on active nodes that beat "
            "within the online window)",
            labels=["region", "gpu_type", "kind"],
        )
        seen = fleet_summary.fleet(session)
        for labels, n in sorted(seen.nodes.items()):
            nodes.add_metric(list(labels), n)
        for (region, gpu_type), count in sorted(seen.gpus.items()):
            for kind in ("total", "allocated", "healthy"):
                gpus.add_metric([region, gpu_type, kind], getattr(count, kind))
        yield nodes
        yield gpus

    def _jobs(self, session: Session) -> Iterator[Metric]:
        found = fleet_summary.jobs(session)
        jobs = GaugeMetricFamily(f"{NAMESPACE}_jobs", "Jobs by state and type", labels=["state", "type"])
        counts = {(s.value, "any"): found.in_state(s) for s in JobState} | found.by_state
        for (state, kind), n in sorted(counts.items()):
            jobs.add_metric([state, kind], n)
        yield jobs
        yield GaugeMetricFamily(f"{NAMESPACE}_jobs_waiting", "Jobs waiting for capacity", value=found.waiting)
        yield GaugeMetricFamily(
            f"{NAMESPACE}_jobs_waiting_oldest_age_seconds",
            "How long the oldest waiting job has waited (0 when none waits)",
            value=found.oldest_wait_s,
        )

    def _ledger(self, session: Session) -> Iterator[Metric]:
        total = CounterMetricFamily(
            f"{NAMESPACE}_ledger_credits", "Credits the ledger moved, by rule", labels=["rule"]
        )
        for rule, micros in session.execute(
            select(LedgerEntry.rule, func.sum(LedgerEntry.amount_micros)).group_by(LedgerEntry.rule)
        ):
            total.add_metric([rule], float(rules.from_micros(int(micros or 0))))
        yield total

    def _reconcilers(self) -> Iterator[Metric]:
        loop = self.loop_of()
        age = GaugeMetricFamily(
            f"{NAMESPACE}_reconciler_last_pass_age_seconds",
            "Seconds since each reconciler's last completed pass (this process, while it leads)",
            labels=["reconciler"],
        )
        took = GaugeMetricFamily(
            f"{NAMESPACE}_reconciler_last_pass_seconds",
            "How long each reconciler's last completed pass took",
            labels=["reconciler"],
        )
        now = time.time()
        for name, (ended, seconds) in sorted((loop.passes if loop is not None else {}).items()):
            age.add_metric([str(name)], max(0.0, now - ended))
            took.add_metric([str(name)], seconds)
        yield age
        yield took


class Metrics:
    """One app's registry: the store's collector and this process's request and refusal series."""

    def __init__(self, loop_of: Any) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.fleet = FleetCollector(loop_of)
        self.registry.register(self.fleet)
        self.requests = Histogram(
            f"{NAMESPACE}_http_request_duration_seconds",
            "API requests by route template, method and status class, and how long they took",
            ["route", "method", "status"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.refusals = Counter(
            f"{NAMESPACE}_refusals",
            "Requests refused, by the refusal's code (rate_limited, token_invalid, quote_invalid, …)",
            ["code"],
            registry=self.registry,
        )

    def refused(self, code: str) -> None:
        self.refusals.labels(code=code).inc()

    def exposition(self, session: Session) -> bytes:
        """Every series, the store's read in `session`."""
        with self.fleet.lock:
            self.fleet.session = session
            try:
                return generate_latest(self.registry)
            finally:
                self.fleet.session = None


def of(app: Any) -> Metrics | None:
    metrics: Metrics | None = getattr(app.state, "metrics", None)
    return metrics


def refusal_code(status: int, body: bytes) -> str:
    """The `code` of an API refusal ({code, message}); `http_<status>` for any other error answer."""
    if len(body) <= REFUSAL_BODY_MAX:
        try:
            code = json.loads(body).get("code")
        except (ValueError, AttributeError):
            code = None
        if isinstance(code, str) and code.isidentifier() and len(code) <= 40:
            return code
    return f"http_{status}"


class RequestTiming:
    """ASGI middleware: each HTTP request's latency by its route's template (no path values, so the
    series stay bounded: a request that matched no route counts as `unmatched`)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = time.perf_counter()
        status = 500
        counted = False

        async def sending(message: Message) -> None:
            nonlocal status, counted
            if message["type"] == "http.response.start":
                status = int(message["status"])
            elif status >= 400 and not counted:
                counted = True
                self.metrics.refused(refusal_code(status, message.get("body", b"")))
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            self.metrics.requests.labels(template, scope["method"], f"{status // 100}xx").observe(
                time.perf_counter() - began
            )


router = APIRouter(tags=["health"])


@router.get(
    METRICS_PATH,
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus exposition format"}},
)
def metrics(request: Request, session: Db, _: Scraper) -> Response:
    """The fleet's metrics in the Prometheus exposition format (docs/monitoring.md)."""
    found = of(request.app)
    assert found is not None
    return Response(found.exposition(session), media_type=CONTENT_TYPE_LATEST)
