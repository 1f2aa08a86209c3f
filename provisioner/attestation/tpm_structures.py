"""Read the few TPM 2.0 wire structures the control plane must understand, in pure Python.

The control plane does not link libtss2 (it may run anywhere; only nodes have TPMs), so the byte layouts
of TPM2B_PUBLIC, TPMS_ATTEST and TPMT_SIGNATURE (TPM 2.0 Library, Part 2) are parsed here with `struct`.
Parsing is strict: unknown algorithms, short buffers and trailing bytes raise `MalformedStructure`,
because a verifier that guesses is a verifier that can be fooled.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, replace
from enum import IntEnum, IntFlag


class MalformedStructure(ValueError):
    """Bytes that are not the TPM structure they claim to be."""


class Alg(IntEnum):
    """TPM2_ALG_ID values used here."""

    RSA = 0x0001
    SHA1 = 0x0004
    HMAC = 0x0005
    AES = 0x0006
    KEYEDHASH = 0x0008
    SHA256 = 0x000B
    SHA384 = 0x000C
    SHA512 = 0x000D
    NULL = 0x0010
    RSASSA = 0x0014
    RSAES = 0x0015
    RSAPSS = 0x0016
    OAEP = 0x0017
    ECDSA = 0x0018
    ECDH = 0x0019
    ECDAA = 0x001A
    ECSCHNORR = 0x001C
    ECC = 0x0023
    SYMCIPHER = 0x0025
    CFB = 0x0043


class Curve(IntEnum):
    NIST_P256 = 0x0003
    NIST_P384 = 0x0004
    NIST_P521 = 0x0005


class ObjectAttr(IntFlag):
    """TPMA_OBJECT bits (Part 2, 8.3)."""

    FIXED_TPM = 1 << 1
    ST_CLEAR = 1 << 2
    FIXED_PARENT = 1 << 4
    SENSITIVE_DATA_ORIGIN = 1 << 5
    USER_WITH_AUTH = 1 << 6
    ADMIN_WITH_POLICY = 1 << 7
    NO_DA = 1 << 10
    ENCRYPTED_DUPLICATION = 1 << 11
    RESTRICTED = 1 << 16
    DECRYPT = 1 << 17
    SIGN_ENCRYPT = 1 << 18


TPM_GENERATED_VALUE = 0xFF544347  # "\xffTCG": only the TPM itself puts this in front of what it signs
TPM_ST_ATTEST_QUOTE = 0x8018
HASH_SIZES = {Alg.SHA1: 20, Alg.SHA256: 32, Alg.SHA384: 48, Alg.SHA512: 64}
HASH_NAMES = {Alg.SHA1: "sha1", Alg.SHA256: "sha256", Alg.SHA384: "sha384", Alg.SHA512: "sha512"}
# Schemes whose TPMS_SCHEME_* carries a count after the hash (ECDAA only).
_SCHEMES_WITH_COUNT = {Alg.ECDAA}


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = memoryview(data)
        self.pos = 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise MalformedStructure(
                f"truncated: wanted {n} bytes at offset {self.pos}, have {len(self.data) - self.pos}"
            )
        out = bytes(self.data[self.pos : self.pos + n])
        self.pos += n
        return out

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return struct.unpack(">H", self.take(2))[0]

    def u32(self) -> int:
        return struct.unpack(">I", self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack(">Q", self.take(8))[0]

    def tpm2b(self) -> bytes:
        return self.take(self.u16())

    def alg(self) -> Alg:
        value = self.u16()
        try:
            return Alg(value)
        except ValueError:
            raise MalformedStructure(f"unknown algorithm 0x{value:04x} at offset {self.pos - 2}") from None

    def end(self) -> None:
        if self.pos != len(self.data):
            raise MalformedStructure(f"{len(self.data) - self.pos} trailing bytes after the structure")


@dataclass(frozen=True)
class TpmPublic:
    """A parsed TPMT_PUBLIC (RSA or ECC). `raw` is its exact marshalled form: the object's name hashes it."""

    raw: bytes
    type: Alg
    name_alg: Alg
    attributes: ObjectAttr
    auth_policy: bytes
    symmetric: tuple[Alg, int, Alg] | None  # (algorithm, key bits, mode) or None for TPM_ALG_NULL
    scheme: Alg
    scheme_hash: Alg | None
    rsa_bits: int = 0
    rsa_exponent: int = 65537
    rsa_modulus: bytes = b""
    curve: Curve | None = None
    ecc_x: bytes = b""
    ecc_y: bytes = b""

    @property
    def name(self) -> bytes:
        """TPM name = nameAlg (2 bytes) || H_nameAlg(TPMT_PUBLIC): what MakeCredential binds to."""
        return struct.pack(">H", self.name_alg) + hashlib.new(HASH_NAMES[self.name_alg], self.raw).digest()

    def has(self, attrs: ObjectAttr) -> bool:
        return (self.attributes & attrs) == attrs


def _sym_def(r: _Reader) -> tuple[Alg, int, Alg] | None:
    algorithm = r.alg()
    if algorithm == Alg.NULL:
        return None
    return (algorithm, r.u16(), r.alg())


def _scheme(r: _Reader) -> tuple[Alg, Alg | None]:
    scheme = r.alg()
    if scheme == Alg.NULL:
        return scheme, None
    hash_alg = r.alg()
    if scheme in _SCHEMES_WITH_COUNT:
        r.u16()
    return scheme, hash_alg


def parse_public(data: bytes, *, sized: bool = True) -> TpmPublic:
    """Parse a TPM2B_PUBLIC (`sized`, as the minion sends it) or a bare TPMT_PUBLIC."""
    outer = _Reader(data)
    body = outer.tpm2b() if sized else data
    if sized:
        outer.end()
    r = _Reader(body)
    kind = r.alg()
    name_alg = r.alg()
    if name_alg not in HASH_NAMES:
        raise MalformedStructure(f"nameAlg {name_alg.name} is not a hash")
    attributes = ObjectAttr(r.u32())
    auth_policy = r.tpm2b()
    symmetric = _sym_def(r)
    scheme, scheme_hash = _scheme(r)
    common = TpmPublic(
        raw=body,
        type=kind,
        name_alg=name_alg,
        attributes=attributes,
        auth_policy=auth_policy,
        symmetric=symmetric,
        scheme=scheme,
        scheme_hash=scheme_hash,
    )
    if kind == Alg.RSA:
        bits, exponent = r.u16(), r.u32()
        modulus = r.tpm2b()
        r.end()
        return replace(common, rsa_bits=bits, rsa_exponent=exponent or 65537, rsa_modulus=modulus)
    if kind == Alg.ECC:
        curve_id = r.u16()
        try:
            curve = Curve(curve_id)
        except ValueError:
            raise MalformedStructure(f"unsupported ECC curve 0x{curve_id:04x}") from None
        _scheme(r)  # KDF scheme: unused by signing keys
        x, y = r.tpm2b(), r.tpm2b()
        r.end()
        return replace(common, curve=curve, ecc_x=x, ecc_y=y)
    raise MalformedStructure(f"unsupported key type {kind.name}")


@dataclass(frozen=True)
class PcrSelection:
    """One TPMS_PCR_SELECTION: a bank and the PCR indices selected in it, ascending."""

    bank: Alg
    indices: tuple[int, ...]


@dataclass(frozen=True)
class QuoteInfo:
    """A parsed TPMS_ATTEST of type quote."""

    qualified_signer: bytes
    extra_data: bytes
    clock: int
    reset_count: int
    restart_count: int
    safe: bool
    firmware_version: int
    pcr_select: tuple[PcrSelection, ...]
    pcr_digest: bytes


def parse_quote(attest: bytes) -> QuoteInfo:
    """Parse TPMS_ATTEST and insist on TPM_GENERATED_VALUE and TPM_ST_ATTEST_QUOTE."""
    r = _Reader(attest)
    magic = r.u32()
    if magic != TPM_GENERATED_VALUE:
        raise MalformedStructure(f"magic 0x{magic:08x} is not TPM_GENERATED_VALUE")
    kind = r.u16()
    if kind != TPM_ST_ATTEST_QUOTE:
        raise MalformedStructure(f"attestation type 0x{kind:04x} is not a quote")
    signer, extra = r.tpm2b(), r.tpm2b()
    clock, resets, restarts, safe = r.u64(), r.u32(), r.u32(), r.u8()
    firmware = r.u64()
    selections = []
    for _ in range(r.u32()):
        bank = r.alg()
        bitmap = r.take(r.u8())
        selections.append(
            PcrSelection(
                bank,
                tuple(
                    byte_i * 8 + bit for byte_i, b in enumerate(bitmap) for bit in range(8) if b & (1 << bit)
                ),
            )
        )
    digest = r.tpm2b()
    r.end()
    return QuoteInfo(signer, extra, clock, resets, restarts, bool(safe), firmware, tuple(selections), digest)


@dataclass(frozen=True)
class Signature:
    """A parsed TPMT_SIGNATURE: RSASSA/RSAPSS carry one value, ECDSA carries (r, s)."""

    alg: Alg
    hash_alg: Alg
    rsa: bytes = b""
    ecc_r: bytes = b""
    ecc_s: bytes = b""


def parse_signature(data: bytes) -> Signature:
    r = _Reader(data)
    alg = r.alg()
    if alg in (Alg.RSASSA, Alg.RSAPSS):
        sig = Signature(alg, r.alg(), rsa=r.tpm2b())
    elif alg == Alg.ECDSA:
        hash_alg = r.alg()
        sig = Signature(alg, hash_alg, ecc_r=r.tpm2b(), ecc_s=r.tpm2b())
    else:
        raise MalformedStructure(f"unsupported signature algorithm {alg.name}")
    r.end()
    return sig


def tpm2b(data: bytes) -> bytes:
    """Marshal bytes as a TPM2B (big-endian u16 size, then the bytes)."""
    return struct.pack(">H", len(data)) + data
