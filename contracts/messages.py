"""The messages between a minion and the control plane, protocol version 1 (docs/join-protocol.md).

JSON; binary fields travel as standard base64, PCR values as hex (as tpm2_pcrread prints them). Both ends
build and parse with these models, so the format has one definition. Messages a minion sends are strict
(`extra="forbid"`: the control plane refuses what it does not understand); messages the control plane
sends ignore unknown fields, so a control plane may add a field without breaking minions already in the
field. The examples recorded in tests/contracts/wire_v1/ pin the bytes of version 1: an image built
before a change must keep joining a control plane built after it."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    SerializerFunctionWrapHandler,
    WithJsonSchema,
    model_serializer,
)

from contracts.attestation import PCR_BANK, PcrBank
from contracts.eventlog import MAX_EVENT_LOG_BYTES
from contracts.identity import MINION_ID_PATTERN

PROTOCOL_VERSION: Final = 1


def _decoder(decode: Callable[[str], bytes]) -> Callable[[Any], Any]:
    """Decode strings (the wire form); let bytes through (models built in Python keep raw bytes)."""

    def convert(value: Any) -> Any:
        if isinstance(value, str):
            try:
                return decode(value)
            except (binascii.Error, ValueError) as exc:
                raise ValueError(f"not valid {decode.__name__} text: {exc}") from None
        return value

    return convert


def base64_text(text: str) -> bytes:
    return base64.b64decode(text, validate=True)


def hex_text(text: str) -> bytes:
    return bytes.fromhex(text)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


B64Bytes = Annotated[
    bytes,
    BeforeValidator(_decoder(base64_text)),
    PlainSerializer(b64, return_type=str),
    WithJsonSchema({"type": "string", "contentEncoding": "base64"}),
]
HexBytes = Annotated[
    bytes,
    BeforeValidator(_decoder(hex_text)),
    PlainSerializer(lambda b: b.hex(), return_type=str),
    WithJsonSchema({"type": "string", "pattern": "^([0-9a-f]{2})*$"}),
]
MinionId = Annotated[str, Field(pattern=f"^{MINION_ID_PATTERN}$")]

# What a node reports about itself (inventory, requirement results, actual state) is stored and served
# back in every node list, so it is bounded: a real report is a few KiB and a handful of levels deep
# (GPUs → each GPU → its fields); these leave ten times that, and keep a join (two reports plus keys
# and certificate) under the control plane's 96 KiB body cap for POST /v1/join.
REPORT_MAX_BYTES: Final = 32 * 1024
REPORT_MAX_DEPTH: Final = 8


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of a JSON value (a scalar is 0), counting no deeper than `limit` + 1."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    deepest = 0
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            level += 1
            deepest = max(deepest, level)
            if level > limit:
                break
            stack.extend((child, level) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def bounded_report(value: dict[str, Any]) -> dict[str, Any]:
    """`value`, or ValueError when it is nested deeper or serialises longer than a report may."""
    if _depth(value, REPORT_MAX_DEPTH) > REPORT_MAX_DEPTH:
        raise ValueError(f"nested deeper than {REPORT_MAX_DEPTH} levels")
    size = len(json.dumps(value, separators=(",", ":"), default=str).encode())
    if size > REPORT_MAX_BYTES:
        raise ValueError(f"{size} bytes of JSON, more than the {REPORT_MAX_BYTES} a report may have")
    return value


Report = Annotated[dict[str, Any], AfterValidator(bounded_report)]


class MinionMessage(BaseModel):
    """A message the minion sends: the control plane refuses unknown fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ControlPlaneMessage(BaseModel):
    """A message the control plane sends: minions ignore fields they do not know."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class JoinRequest(MinionMessage):
    """POST /v1/join body."""

    version: Literal[1] = PROTOCOL_VERSION
    minion_id: MinionId
    ek_public: B64Bytes  # TPM2B_PUBLIC of the RSA-2048 EK (standard template)
    ek_certificate: B64Bytes | None = None  # DER, from NV 0x01C00002
    ak_public: B64Bytes  # TPM2B_PUBLIC of the restricted signing AK created under the EK
    join_token: str = Field(min_length=1)
    inventory: Report = Field(default_factory=dict)
    requirements: Report = Field(default_factory=dict)


class JoinChallenge(ControlPlaneMessage):
    """POST /v1/join response (201): the credential challenge and the nonce to quote over."""

    version: Literal[1] = PROTOCOL_VERSION
    join_id: str
    credential_blob: B64Bytes  # TPM2B_ID_OBJECT
    encrypted_secret: B64Bytes  # TPM2B_ENCRYPTED_SECRET
    nonce: B64Bytes
    pcr_bank: PcrBank = PCR_BANK
    pcrs: list[int]
    expires_at: datetime


def bounded_event_log(value: bytes) -> bytes:
    """`value`, or ValueError when it is larger than any firmware's event log (contracts/eventlog.py)."""
    if len(value) > MAX_EVENT_LOG_BYTES:
        raise ValueError(
            f"{len(value)} bytes, more than the {MAX_EVENT_LOG_BYTES} an event log may have: "
            "send the firmware's binary_bios_measurements unchanged"
        )
    return value


EventLog = Annotated[B64Bytes, AfterValidator(bounded_event_log)]


class QuoteMessage(MinionMessage):
    """A quote and the PCR values it covers (join proof and continuous attestation). PCRs in index order.
    `event_log`: the firmware's TCG event log (binary_bios_measurements), which the verifier replays for
    PCR 4 (docs/join-protocol.md, "Boot path (PCR 4)"); None where the node has none (older minions,
    swtpm labs). Left out of the wire form when None, so a quote without one keeps version 1's bytes."""

    attest: B64Bytes  # TPMS_ATTEST
    signature: B64Bytes  # TPMT_SIGNATURE
    pcr_bank: PcrBank = PCR_BANK
    pcrs: dict[int, HexBytes]
    event_log: EventLog | None = None

    @model_serializer(mode="wrap")
    def _without_absent_log(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if self.event_log is None:
            data.pop("event_log", None)
        return data


class ProofRequest(MinionMessage):
    """POST /v1/join/{join_id}/proof body."""

    version: Literal[1] = PROTOCOL_VERSION
    activated_secret: B64Bytes
    quote: QuoteMessage


class JoinResult(ControlPlaneMessage):
    """POST /v1/join/{join_id}/proof response: 200 with the node credential once joined, 202 while pending.
    `state` is `pending` or the node's state."""

    state: str
    message: str
    node_id: str | None = None
    node_name: str | None = None
    node_credential: str | None = None
    heartbeat_interval_s: float


class KeyJoinRequest(MinionMessage):
    """POST /v1/join body of a device without a TPM (contracts/device_key.py): its device key instead of
    an EK and AK. Accepted only in regions that allow devices without a TPM."""

    version: Literal[1] = PROTOCOL_VERSION
    minion_id: MinionId
    device_key: B64Bytes  # DER SubjectPublicKeyInfo, ECDSA P-256
    join_token: str = Field(min_length=1)
    inventory: Report = Field(default_factory=dict)
    requirements: Report = Field(default_factory=dict)


class KeyJoinChallenge(ControlPlaneMessage):
    """POST /v1/join response (201) to a KeyJoinRequest: the nonce to sign."""

    version: Literal[1] = PROTOCOL_VERSION
    join_id: str
    nonce: B64Bytes
    expires_at: datetime


class KeyProofRequest(MinionMessage):
    """POST /v1/join/{join_id}/proof body of a device-key join: the ECDSA-SHA256 signature (DER) over
    contracts.device_key.join_message(join_id, minion_id, nonce, report_digest)."""

    version: Literal[1] = PROTOCOL_VERSION
    signature: B64Bytes


class HeartbeatRequest(MinionMessage):
    """POST /v1/nodes/{node_id}/heartbeat body (node credential auth). Fields left out are not sent
    (`to_wire`): `quote` only answers a `quote_nonce`, inventory and requirements only when re-reported.
    A device that joined with a device key answers the nonce with `key_signature` (DER ECDSA over
    contracts.device_key.heartbeat_message) instead of a quote."""

    version: int = PROTOCOL_VERSION
    actual: Report = Field(default_factory=dict)
    quote: QuoteMessage | None = None
    key_signature: B64Bytes | None = None
    inventory: Report | None = None
    requirements: Report | None = None
    # the `desired_revision` of the last answer this minion holds the desired state of: an answer whose
    # desired state is still that one leaves `desired` out (a few bytes, not the whole state again)
    desired_revision: str | None = Field(default=None, max_length=64)

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


class HeartbeatResponse(ControlPlaneMessage):
    """The heartbeat's answer: the node's state, its desired state and, every K beats, a nonce (base64) the
    next beat must quote over (continuous attestation). `desired` is None when it is the state the
    request's `desired_revision` names: the minion keeps applying the one it holds."""

    node_id: str
    state: str
    reason: str | None
    desired: dict[str, Any] | None
    quote_nonce: str | None
    heartbeat_interval_s: float
    desired_revision: str | None = None  # names this desired state; the next request echoes it


def to_wire(message: BaseModel) -> dict[str, Any]:
    """A message as the JSON object that goes on the wire (every field, nulls included)."""
    return message.model_dump(mode="json")
