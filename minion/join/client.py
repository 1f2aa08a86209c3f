"""The minion's HTTP side of the join and the heartbeat: where the control plane is (enrollment bundle,
or URL + token, or the finalized node's /etc/rigbase/minion.yaml), and one join attempt as data.

`attempt_join` runs POST /v1/join → ActivateCredential + Quote in the TPM → POST /v1/join/{id}/proof and
returns a JoinOutcome: joined (with the node credential), pending (attested, waiting for an operator),
or refused (code + the operator-readable message). It never raises for an answer the control plane
gives; only the transport can fail (ConnectionProblem), which the caller retries."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import httpx

from minion.join.attest import Challenge, join_request, proof_payload

BUNDLE_VERSION = 1


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
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise EnrollmentError(f"cannot read the enrollment bundle {path} ({exc}); write it with "
                                  "`provision region bundle REGION -o FILE`") from None
        if not isinstance(data, dict) or data.get("version") != BUNDLE_VERSION:
            raise EnrollmentError(f"{path} is not a version-1 enrollment bundle; write a new one with "
                                  "`provision region bundle REGION -o FILE`")
        missing = [k for k in ("control_plane_url", "join_token", "region") if not data.get(k)]
        if missing:
            raise EnrollmentError(f"the enrollment bundle {path} lacks {', '.join(missing)}; write a new one")
        return cls(data["control_plane_url"], data["join_token"], data["region"], data.get("ca_certificate"),
                   data.get("storage_mode"), bool(data.get("public_jobs", False)))


@dataclass(frozen=True)
class JoinOutcome:
    state: str  # "joined" | "pending" | "refused" | "errored"
    message: str
    code: str | None = None
    node: dict[str, Any] = field(default_factory=dict)  # node_id, node_name, node_credential, state, …


class ControlPlane:
    """httpx client for one control plane, trusting the bundle's CA when it has one."""

    def __init__(self, enrollment: Enrollment, timeout: float = 15.0) -> None:
        self.enrollment = enrollment
        verify: Any = True
        if enrollment.ca_certificate:
            ca = tempfile.NamedTemporaryFile("w", suffix=".pem", delete=False)
            ca.write(enrollment.ca_certificate)
            ca.close()
            verify = ca.name
        self.http = httpx.Client(base_url=enrollment.control_plane_url.rstrip("/"), verify=verify, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def post(self, path: str, body: Mapping[str, Any], token: str | None = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            response = self.http.post(path, json=body, headers=headers)
        except httpx.TransportError as exc:
            raise ConnectionProblem(f"cannot reach the control plane at {self.enrollment.control_plane_url} "
                                    f"({type(exc).__name__})") from exc
        if response.status_code >= 500:
            raise ConnectionProblem(f"the control plane answered HTTP {response.status_code}: {_message(response)}")
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


def attempt_join(cp: ControlPlane, session: Any, ak: Any, *, inventory: Mapping[str, Any],
                 requirements: Mapping[str, Any]) -> JoinOutcome:
    """One complete join attempt with the TPM session `session` and AK `ak`."""
    token = cp.enrollment.join_token
    if not token:
        raise EnrollmentError("no join token: pass --bundle FILE or --join-token")
    body = join_request(session, ak, join_token=token, inventory=inventory, requirements=requirements)
    response = cp.post("/v1/join", body)
    if response.status_code != 201:
        return _refusal(response)
    challenge = Challenge.from_json(response.json())
    response = cp.post(f"/v1/join/{challenge.join_id}/proof", proof_payload(session, ak, challenge), token=token)
    if response.status_code == 202:
        return JoinOutcome("pending", response.json().get("message", "waiting for an operator"))
    if response.status_code == 200:
        node = response.json()
        return JoinOutcome("joined", f"joined as node '{node.get('node_name')}' ({node.get('state')})", node=node)
    return _refusal(response)


def _refusal(response: httpx.Response) -> JoinOutcome:
    code = _code(response)
    state = "errored" if code == "node_errored" else "refused"
    return JoinOutcome(state, _message(response), code=code)
