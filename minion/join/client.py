"""The minion's HTTP side of the join and the heartbeat: where the control plane is (enrollment bundle,
or URL + token, or the finalized node's /etc/rigbase/minion.yaml), and one join attempt as data.

`attempt_join` runs POST /v1/join → ActivateCredential + Quote in the TPM → POST /v1/join/{id}/proof and
returns a JoinStatus: joined (with the node credential), pending (attested, waiting for an operator),
or refused (code + the operator-readable message). It never raises for an answer the control plane
gives; only the transport can fail (ConnectionProblem), which the caller retries."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from pydantic import ValidationError

from contracts.bundle import BundleError, read_bundle
from contracts.messages import JoinResult, KeyJoinChallenge
from minion.device_key import DeviceKey
from minion.join.attest import join_request, parse_challenge, proof_payload
from minion.join.tls_resume import ResumingContext


class EnrollmentError(ValueError):
    """The bundle or configuration cannot be used; the message says what to fix."""


class ConnectionProblem(RuntimeError):
    """The control plane could not be reached (or answered 5xx): retry later."""


@dataclass(frozen=True)
class Enrollment:
    control_plane_url: str
    join_token: str | None
    region: str | None = None
    ca_certificate: str | None = None
    storage_mode: str | None = None
    public_jobs: bool = False

    @classmethod
    def from_bundle(cls, path: Path) -> Enrollment:
        try:
            bundle = read_bundle(path)
        except BundleError as exc:
            raise EnrollmentError(exc.message) from None
        return cls(
            bundle.control_plane_url,
            bundle.join_token,
            bundle.region,
            bundle.ca_certificate,
            bundle.storage_mode,
            bundle.public_jobs,
        )


@dataclass(frozen=True)
class JoinStatus:
    """Where one join attempt left this minion, as it records it (status.json) and the banner shows it."""

    state: str  # "joined" | "pending" | "refused" | "errored"
    message: str
    code: str | None = None
    node: dict[str, Any] = field(default_factory=dict)  # node_id, node_name, node_credential, state, …


# httpx's own default: a connection idle this long is closed (the logs, outputs and objects clients)
IDLE_S = 5.0


def beat_idle_s(interval_s: float) -> float:
    """How long the heartbeat's client keeps its idle connection: past the next beat, and shorter than the
    server's keep-alive (provisioner/api/tuning.py keep_alive_s: 2 x interval + 15), so the server never
    closes a connection the minion is about to send on."""
    return 1.5 * interval_s + 5


#: How long a minion keeps one connection before its next request asks the server to close it
#: (`Connection: close`), so that the request after it opens a new one, resuming TLS. Behind a load
#: balancer a connection stays on its host for as long as it lives: a host restarted or added gets its
#: share of the fleet back within this long. Each connection draws its own lifetime within ±25 % of
#: it, so a fleet that reconnected at once (a host restarted) spreads its next reconnects out.
CONNECTION_LIFETIME_S = 600.0
CONNECTION_LIFETIME_JITTER = 0.25


def connection_lifetime_s(
    mean_s: float = CONNECTION_LIFETIME_S, draw: Callable[[], float] = random.random
) -> float:
    """One connection's lifetime: `mean_s` within ±CONNECTION_LIFETIME_JITTER, uniformly."""
    return mean_s * (1 - CONNECTION_LIFETIME_JITTER + 2 * CONNECTION_LIFETIME_JITTER * draw())


class ConnectionAge:
    """When the connection a client sends on was opened (the first answer it carried, told apart by
    httpcore's network stream), and whether the next request is past its lifetime and so its last."""

    def __init__(
        self,
        mean_s: float,
        clock: Callable[[], float] = time.monotonic,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self.mean_s, self.clock, self.draw = mean_s, clock, draw
        self.lifetime_s = connection_lifetime_s(mean_s, draw)
        self.stream: object | None = None
        self.opened_at = 0.0

    def last(self) -> bool:
        """The next request asks for its connection to be closed after its answer."""
        return self.stream is not None and self.clock() - self.opened_at >= self.lifetime_s

    def answered(self, stream: object | None, sent_at: float, closed: bool) -> None:
        """A request sent at `sent_at` was answered on `stream`; `closed`: the connection ends with it."""
        if closed:
            self.stream, self.lifetime_s = None, connection_lifetime_s(self.mean_s, self.draw)
        elif stream is not self.stream:
            self.stream, self.opened_at = stream, sent_at

    def forget(self) -> None:
        """The connection failed or was closed: the next one is aged from its own first answer."""
        self.stream = None


class ControlPlane:
    """httpx client for one control plane, trusting the bundle's CA when it has one. A connection is kept
    `idle_s` between requests and let go after its lifetime (`lifetime_s` on average, ConnectionAge); a new
    one resumes the last TLS session (minion/join/tls_resume.py)."""

    def __init__(
        self,
        enrollment: Enrollment,
        timeout: float = 15.0,
        idle_s: float = IDLE_S,
        lifetime_s: float = CONNECTION_LIFETIME_S,
    ) -> None:
        self.enrollment = enrollment
        self.timeout = timeout
        self.tls = self.ssl_context()
        self.idle_s = idle_s
        self.age = ConnectionAge(lifetime_s)
        self.http = self._client()

    def _client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.enrollment.control_plane_url.rstrip("/"),
            verify=self.tls,
            timeout=self.timeout,
            limits=httpx.Limits(keepalive_expiry=self.idle_s),
        )

    def ssl_context(self) -> ResumingContext:
        """The bundle's CA only when it has one: a certificate any public CA signed for the name is no
        proof that this is the control plane the join token belongs to. The system's store otherwise."""
        return ResumingContext(self.enrollment.ca_certificate)

    def keep_idle(self, seconds: float) -> None:
        """Keep an idle connection `seconds` from now on (a new client, the same TLS session)."""
        if seconds != self.idle_s:
            self.idle_s = seconds
            self.http.close()
            self.age.forget()
            self.http = self._client()

    def close(self) -> None:
        self.http.close()

    def post(self, path: str, body: Mapping[str, Any], token: str | None = None) -> httpx.Response:
        return self._send("POST", path, token, json=body)

    def get(self, path: str, token: str | None = None) -> httpx.Response:
        return self._send("GET", path, token)

    def send(
        self,
        method: str,
        path: str,
        token: str | None,
        headers: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        """Any request (`json=`, `content=`); ConnectionProblem as for post."""
        return self._send(method, path, token, headers, **kwargs)

    def headers(self, token: str | None, last: bool = False) -> dict[str, str]:
        """A request's own headers: its credential, and `Connection: close` on its connection's last."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if last:
            headers["Connection"] = "close"
        return headers

    def _send(
        self, method: str, path: str, token: str | None, more: Mapping[str, str] | None = None, **kwargs: Any
    ) -> httpx.Response:
        headers = self.headers(token, self.age.last())
        headers.update(more or {})
        sent_at = self.age.clock()
        try:
            response = self.http.request(method, path, headers=headers, **kwargs)
        except httpx.TransportError as exc:
            self.age.forget()
            raise ConnectionProblem(
                f"cannot reach the control plane at {self.enrollment.control_plane_url} "
                f"({type(exc).__name__})"
            ) from exc
        closed = "close" in (headers.get("Connection"), response.headers.get("Connection"))
        self.age.answered(response.extensions.get("network_stream"), sent_at, closed)
        if response.status_code >= 500:
            raise ConnectionProblem(
                f"the control plane answered HTTP {response.status_code}: {_message(response)}"
            )
        return response


def _message(response: httpx.Response) -> str:
    try:
        body = response.json()
        return str(body.get("message") or body)
    except ValueError:
        return response.text[:200]


def _code(response: httpx.Response) -> str | None:
    try:
        return response.json().get("code")
    except (ValueError, AttributeError):
        return None


def attempt_join(
    cp: ControlPlane,
    session: Any,
    ak: Any,
    *,
    inventory: Mapping[str, Any],
    requirements: Mapping[str, Any],
    event_log: bytes | None = None,
) -> JoinStatus:
    """One complete join attempt with the TPM session `session` and AK `ak`; `event_log` (the firmware's,
    attest.read_event_log) goes with the proof's quote."""
    token = cp.enrollment.join_token
    if not token:
        raise EnrollmentError("no join token: pass --bundle FILE or --join-token")
    body = join_request(session, ak, join_token=token, inventory=inventory, requirements=requirements)
    response = cp.post("/v1/join", body)
    if response.status_code != 201:
        return _refusal(response)
    challenge = parse_challenge(response.json())
    response = cp.post(
        f"/v1/join/{challenge.join_id}/proof", proof_payload(session, ak, challenge, event_log), token=token
    )
    return _proof_outcome(response)


def attempt_key_join(
    cp: ControlPlane,
    key: DeviceKey,
    *,
    inventory: Mapping[str, Any],
    requirements: Mapping[str, Any],
) -> JoinStatus:
    """One join attempt of a device without a TPM (docs/join-protocol.md "Devices without a TPM"): the
    device key's request, then a signature over the challenge and the report it sent."""
    token = cp.enrollment.join_token
    if not token:
        raise EnrollmentError("no join token: pass --bundle FILE or --join-token")
    response = cp.post(
        "/v1/join", key.join_request(join_token=token, inventory=inventory, requirements=requirements)
    )
    if response.status_code != 201:
        return _refusal(response)
    try:
        challenge = KeyJoinChallenge.model_validate_json(response.content)
    except ValidationError as exc:
        raise ValueError(f"the control plane's join challenge is malformed: {exc}") from None
    response = cp.post(
        f"/v1/join/{challenge.join_id}/proof", key.proof(challenge, inventory, requirements), token=token
    )
    return _proof_outcome(response)


def _proof_outcome(response: httpx.Response) -> JoinStatus:
    if response.status_code == 202:
        return JoinStatus("pending", JoinResult.model_validate_json(response.content).message)
    if response.status_code == 200:
        result = JoinResult.model_validate_json(response.content)
        return JoinStatus(
            "joined", f"joined as node '{result.node_name}' ({result.state})", node=response.json()
        )
    return _refusal(response)


def _refusal(response: httpx.Response) -> JoinStatus:
    code = _code(response)
    state = "errored" if code == "node_errored" else "refused"
    return JoinStatus(state, _message(response), code=code)
