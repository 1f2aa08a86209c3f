"""The join messages as the control plane reads and writes them (JSON; binary fields base64, PCR values
hex). The format is documented in docs/join-protocol.md; the minion has its own copy of the shapes
(minion/join/attest.py) because the minion never imports the control plane."""

from __future__ import annotations

import base64
import binascii
from datetime import datetime
from typing import Annotated, Any, Callable, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, WithJsonSchema

from provisioner.attestation.quote import PCR_BANK, QuoteEvidence


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


def b64decode(text: str) -> bytes:
    return base64.b64decode(text, validate=True)


def hex(text: str) -> bytes:  # noqa: A001 - the name appears in validation errors ("not valid hex text")
    return bytes.fromhex(text)


# Binary fields travel as standard base64 (PCR values as hex, as tpm2_pcrread prints them).
B64Bytes = Annotated[bytes, BeforeValidator(_decoder(b64decode)),
                     PlainSerializer(lambda b: base64.b64encode(b).decode("ascii"), return_type=str),
                     WithJsonSchema({"type": "string", "contentEncoding": "base64"})]
HexBytes = Annotated[bytes, BeforeValidator(_decoder(hex)), PlainSerializer(lambda b: b.hex(), return_type=str),
                     WithJsonSchema({"type": "string", "pattern": "^([0-9a-f]{2})*$"})]
MinionId = Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]
PROTOCOL_VERSION = 1


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class JoinRequest(_Message):
    """POST /v1/join body."""

    version: Literal[1] = PROTOCOL_VERSION
    minion_id: MinionId
    ek_public: B64Bytes  # TPM2B_PUBLIC of the RSA-2048 EK (standard template)
    ek_certificate: B64Bytes | None = None  # DER, from NV 0x01C00002
    ak_public: B64Bytes  # TPM2B_PUBLIC of the restricted signing AK created under the EK
    join_token: str = Field(min_length=1)
    inventory: dict[str, Any] = Field(default_factory=dict)
    requirements: dict[str, Any] = Field(default_factory=dict)


class JoinChallenge(_Message):
    """POST /v1/join response (201): the credential challenge and the nonce to quote over."""

    version: Literal[1] = PROTOCOL_VERSION
    join_id: str
    credential_blob: B64Bytes  # TPM2B_ID_OBJECT
    encrypted_secret: B64Bytes  # TPM2B_ENCRYPTED_SECRET
    nonce: B64Bytes
    pcr_bank: Literal["sha256"] = PCR_BANK
    pcrs: list[int]
    expires_at: datetime


class QuoteMessage(_Message):
    """A quote and the PCR values it covers (join proof and continuous attestation)."""

    attest: B64Bytes  # TPMS_ATTEST
    signature: B64Bytes  # TPMT_SIGNATURE
    pcr_bank: Literal["sha256"] = PCR_BANK
    pcrs: dict[int, HexBytes]

    def evidence(self) -> QuoteEvidence:
        return QuoteEvidence(self.attest, self.signature, dict(self.pcrs))


class ProofRequest(_Message):
    """POST /v1/join/{join_id}/proof body."""

    version: Literal[1] = PROTOCOL_VERSION
    activated_secret: B64Bytes
    quote: QuoteMessage


class PendingJoin(_Message):
    """What the control plane keeps between the two calls (store it keyed by join_id, e.g. as JSON).
    Only a hash of the secret is kept, so a leaked row cannot answer the challenge."""

    join_id: str
    minion_id: MinionId
    ek_public: B64Bytes
    ek_certificate: B64Bytes | None
    ak_public: B64Bytes
    secret_sha256: HexBytes
    nonce: B64Bytes
    expires_at: datetime
