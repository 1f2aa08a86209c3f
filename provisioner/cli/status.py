"""`provision status` (the fleet at a glance) and `provision doctor` (is this CLI, its control plane and
the fleet's enrolment set up right), each with --json. Doctor's checks are data: one function each, run in
order, each answering ok / warn / fail with a line that says what to do."""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from enum import StrEnum
from importlib import metadata
from typing import Any
from urllib.parse import urlsplit

import httpx
import typer

from provisioner.cli import render
from provisioner.cli.common import Json
from provisioner.cli.settings import connect
from provisioner.client import Client, ControlPlaneError

STATUS_COLUMNS = [
    ("region", "REGION"),
    ("provider", "PROVIDER"),
    ("state", "STATE"),
    ("nodes", "NODES"),
    ("nodes_active", "ACTIVE"),
    ("nodes_offline", "OFFLINE"),
    ("nodes_errored", "ERRORED"),
    ("gpus_free", "GPUS FREE"),
    ("gpus_allocated", "GPUS USED"),
    ("minions_pending", "PENDING"),
    ("join_tokens", "JOIN TOKENS"),
    ("join_tokens_expiring", "EXPIRING <24H"),
]
MAX_SKEW_S = 5.0  # join tokens, nonces and quote deadlines are compared across the two clocks


def status(json_out: Json = False) -> None:
    """Every region: nodes by state, offline, pending minions, join tokens; refusals of the last day."""
    out = connect().get("/v1/status")
    if json_out:
        render.print_json(out)
        return
    rows = [r | {"gpus_free": r["gpus"] - r["gpus_allocated"]} for r in out["regions"]]
    render.table(rows, STATUS_COLUMNS, as_json=False, empty="no region yet: `provision region create`")
    waited = f", the oldest for {render.human_duration(out['oldest_wait_s'])}" if out["jobs_waiting"] else ""
    running, waiting = out["jobs_running"], out["jobs_waiting"]
    print(f"jobs: {running} running, {waiting} waiting{waited} (`provision job list`)")
    print(f"join refusals in the last 24 h: {out['refusals_24h']} (`provision node refusals`)")


class Verdict(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True)
class Finding:
    check: str
    verdict: Verdict
    detail: str


@dataclass
class Probe:
    """What the checks share: the client, and what the server answered (filled as the checks run)."""

    client: Client
    health: httpx.Response | None = None
    status: dict[str, Any] | None = None


def client_version() -> str:
    try:
        return metadata.version("rigbase")
    except metadata.PackageNotFoundError:
        return "unknown"


def _reachable(p: Probe) -> Finding:
    started = time.monotonic()
    try:
        p.health = p.client.http.get("/healthz", timeout=5)
    except httpx.HTTPError as exc:
        return Finding(
            "server",
            Verdict.FAIL,
            f"{p.client.url} does not answer ({type(exc).__name__}): is `provision serve` up?",
        )
    ms = (time.monotonic() - started) * 1000
    return Finding("server", Verdict.OK, f"{p.client.url} answers /healthz in {ms:.0f} ms")


def _transport(p: Probe) -> Finding:
    url = urlsplit(p.client.url)
    if url.scheme == "https":
        return Finding("tls", Verdict.OK, "the API is reached over TLS")
    try:
        loopback = ipaddress.ip_address(url.hostname or "").is_loopback
    except ValueError:
        loopback = url.hostname == "localhost"
    if loopback:
        return Finding(
            "tls", Verdict.WARN, "plain HTTP on loopback: fine on this host, never across a network"
        )
    return Finding(
        "tls", Verdict.FAIL, "plain HTTP across the network: tokens travel unencrypted; serve with TLS"
    )


def _authenticated(p: Probe) -> Finding:
    if p.health is None:
        return Finding("token", Verdict.FAIL, "not checked: the server does not answer")
    try:
        p.status = p.client.get("/v1/status")
    except ControlPlaneError as exc:
        return Finding("token", Verdict.FAIL, f"{exc.message}")
    return Finding("token", Verdict.OK, "the operator token is accepted")


def _versions(p: Probe) -> Finding:
    if p.status is None:
        return Finding("versions", Verdict.FAIL, "not checked: no status from the server")
    mine, theirs = client_version(), p.status["version"]
    if mine != theirs:
        return Finding("versions", Verdict.WARN, f"client {mine}, server {theirs}: upgrade the older one")
    return Finding("versions", Verdict.OK, f"client and server {mine}, schema {p.status['schema_revision']}")


def _schema(p: Probe) -> Finding:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from provisioner.store.migrate import MIGRATIONS

    if p.status is None:
        return Finding("schema", Verdict.FAIL, "not checked: no status from the server")
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    newest = ",".join(sorted(ScriptDirectory.from_config(cfg).get_heads()))
    if p.status["schema_revision"] != newest:
        return Finding(
            "schema",
            Verdict.WARN,
            f"server schema {p.status['schema_revision']}, this client knows {newest}: versions differ",
        )
    return Finding("schema", Verdict.OK, f"schema {newest}")


def _clock(p: Probe) -> Finding:
    if p.health is None or "date" not in p.health.headers:
        return Finding("clock", Verdict.WARN, "not checked: the server sent no Date header")
    skew = abs(parsedate_to_datetime(p.health.headers["date"]).timestamp() - time.time())
    if skew > MAX_SKEW_S:
        return Finding(
            "clock", Verdict.FAIL, f"client and server clocks differ by {skew:.0f} s: run NTP on both"
        )
    return Finding("clock", Verdict.OK, f"clocks agree within {MAX_SKEW_S:.0f} s")


def _tpm_cas(p: Probe) -> Finding:
    if p.status is None:
        return Finding("tpm-cas", Verdict.FAIL, "not checked: no status from the server")
    cas = p.client.get("/v1/tpm-cas")["items"]
    if not cas:
        return Finding(
            "tpm-cas", Verdict.FAIL, "no TPM vendor CA is trusted: no node can join (`provision tpm-ca add`)"
        )
    return Finding("tpm-cas", Verdict.OK, f"{len(cas)} TPM vendor CA certificate(s) trusted")


def _enrolment(p: Probe) -> Finding:
    if p.status is None:
        return Finding("join-tokens", Verdict.FAIL, "not checked: no status from the server")
    regions = p.status["regions"]
    none = [r["region"] for r in regions if r["join_tokens"] == 0]
    soon = [r["region"] for r in regions if r["join_tokens_expiring"]]
    if none:
        return Finding(
            "join-tokens",
            Verdict.WARN,
            f"no live join token in {', '.join(none)}: media made earlier cannot enrol nodes there "
            "(`provision region bundle REGION`)",
        )
    if soon:
        return Finding("join-tokens", Verdict.WARN, f"join tokens expire within a day in {', '.join(soon)}")
    return Finding("join-tokens", Verdict.OK, f"every region ({len(regions)}) has a live join token")


def _bundle_url(p: Probe) -> Finding:
    host = urlsplit(p.client.url).hostname or ""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if loopback:
        return Finding(
            "bundle-url",
            Verdict.WARN,
            f"this CLI reaches the API at {p.client.url}: nodes cannot; give `region bundle` "
            "--control-plane-url with an address they reach",
        )
    return Finding("bundle-url", Verdict.OK, f"bundles made here point nodes at {p.client.url}")


CHECKS: list[Callable[[Probe], Finding]] = [
    _reachable,
    _transport,
    _authenticated,
    _versions,
    _schema,
    _clock,
    _tpm_cas,
    _enrolment,
    _bundle_url,
]


def doctor(json_out: Json = False) -> None:
    """Check this CLI's control plane: reachable, TLS, token, versions, schema, clock, TPM CAs, join
    tokens, bundle URL. Exit 1 when a check fails."""
    probe = Probe(connect())
    findings = [check(probe) for check in CHECKS]
    rows = [{"check": f.check, "verdict": f.verdict.value, "detail": f.detail} for f in findings]
    if json_out:
        render.print_json(rows)
    else:
        columns = [("check", "CHECK"), ("verdict", "RESULT"), ("detail", "DETAIL")]
        render.table(rows, columns, as_json=False, wrap=("detail",))
    if any(f.verdict is Verdict.FAIL for f in findings):
        raise typer.Exit(1)
